#!/usr/bin/env python3
"""The PyTorch peer of bench/gpt_step (issue 15): GPT-2 124M as transformers' GPT2LMHeadModel,
trained with Hugging Face Accelerate in bf16 on synthetic uniform tokens, eager or with
torch.compile (Accelerate's dynamo_backend="inductor").

The step is what a user of those libraries writes: forward with labels (the model shifts them
and computes the loss; every one of the B x T positions goes through the model and the head),
accelerator.backward, accelerator.clip_grad_norm_(1.0), AdamW (lr 6e-4, betas 0.9/0.95, eps
1e-8, weight decay 0.1 on every parameter as accel_adamw does; fused=True), zero_grad(None).
Model: 12 layers, 768 wide, 12 heads, 1024 positions, vocabulary 50304, dropout 0, tied head,
tanh GELU (GPT-2's gelu_new), attention through torch's scaled_dot_product_attention (its fused
kernels), as bench/gpt_step's gpt2-124m preset (which also has a tied head and the tanh GELU).

Timing: --warmup steps (compilation happens there) are not timed. Each of the --steps timed
steps is timed by CUDA events recorded between steps (nothing synchronises inside the loop, so
the host queues work ahead as in training; the events include any time the GPU waits for the
host); step_ms is the median step, as bench/gpt_step reports, and tokens_per_s = B x T /
step_ms. peak_mem_gib is torch.cuda.max_memory_allocated() over the whole run, warm-up
included (on the CPU: the process's peak resident set size).

Output, last line machine-readable (bench/peers/run.sh parses it):
  torch_gpt2: <human summary>
  tokens_per_s=<x> peak_mem_gib=<y> step_ms=<z>
Exits 77 when --device cuda finds no CUDA device, 2 on bad arguments.
"""
import argparse
import math
import resource
import statistics
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--batch", "-B", type=int, default=32, help="sequences per step (32)")
    p.add_argument("--seq", "-T", type=int, default=1024, help="tokens per sequence (1024)")
    p.add_argument("--steps", type=int, default=20, help="timed steps (20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (3)")
    p.add_argument("--compile", type=int, choices=(0, 1), default=0,
                   help="1: torch.compile through Accelerate (inductor)")
    p.add_argument("--mixed_precision", choices=("bf16", "no"), default="bf16")
    p.add_argument("--n_layer", type=int, default=12)
    p.add_argument("--n_embd", type=int, default=768)
    p.add_argument("--n_head", type=int, default=12)
    p.add_argument("--n_positions", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after the timed steps, profile one more step (torch.profiler) and "
                        "print its N longest kernels, summed by name (0: no profile)")
    a = p.parse_args(argv)
    for name in ("batch", "seq", "steps", "n_layer", "n_embd", "n_head", "n_positions", "vocab"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1 (got {getattr(a, name)})")
    if a.warmup < 0 or a.profile < 0:
        p.error(f"--warmup and --profile must be at least 0 (got {a.warmup}, {a.profile})")
    if a.n_embd % a.n_head:
        p.error(f"--n_embd {a.n_embd} is not a multiple of --n_head {a.n_head}")
    if a.seq > a.n_positions:
        p.error(f"--seq {a.seq} is longer than --n_positions {a.n_positions}")
    return a


def print_profile(torch, run_step, n):
    """One step under torch.profiler: its n longest kernels (device time summed by name)."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        run_step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    t, c, total = {}, {}, 0.0
    for e in prof.events():
        us = e.device_time if hasattr(e, "device_time") else getattr(e, "cuda_time", 0.0)
        us = us if str(getattr(e, "device_type", "")).endswith("CUDA") else 0.0
        if us > 0:
            t[e.name] = t.get(e.name, 0.0) + us
            c[e.name] = c.get(e.name, 0) + 1
            total += us
    print(f"torch_gpt2: profile of one step: {total / 1e3:.2f} ms of kernels", flush=True)
    if total == 0:  # an older or newer profiler's event fields: its own table
        key = "self_device_time_total" if hasattr(torch.autograd.profiler_util.FunctionEventAvg,
                                                  "self_device_time_total") else "self_cuda_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=n, max_name_column_width=90))
    for name in sorted(t, key=t.get, reverse=True)[:n]:
        print(f"{t[name] / 1e3:10.3f} ms {c[name]:5d}  {name[:110]}", flush=True)


def main(argv):
    a = parse_args(argv)
    # Imported here so that --help works without them.
    import torch
    from accelerate import Accelerator
    from transformers import GPT2Config, GPT2LMHeadModel

    if a.device == "cuda" and not torch.cuda.is_available():
        print("torch_gpt2: SKIP: --device cuda but torch sees no CUDA device", flush=True)
        return 77
    torch.manual_seed(a.seed)
    # Only matters for fp32 matmuls (--mixed_precision no): the usual setting for speed.
    torch.set_float32_matmul_precision("high")

    acc = Accelerator(mixed_precision=a.mixed_precision, cpu=a.device == "cpu",
                      dynamo_backend="inductor" if a.compile else "no")
    cfg = GPT2Config(vocab_size=a.vocab, n_positions=a.n_positions, n_embd=a.n_embd,
                     n_layer=a.n_layer, n_head=a.n_head, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, use_cache=False, bos_token_id=min(50256, a.vocab - 1),
                     eos_token_id=min(50256, a.vocab - 1))
    cfg._attn_implementation = "sdpa"
    model = GPT2LMHeadModel(cfg)
    model.loss_type = "ForCausalLM"  # what transformers falls back to, without its warning
    n_params = sum(p.numel() for p in model.parameters())
    # fused: PyTorch's fastest AdamW (one kernel for all parameters; CUDA and CPU have it).
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=a.weight_decay, fused=True)
    model, opt = acc.prepare(model, opt)
    model.train()

    # Synthetic uniform tokens, made on the device beforehand (a loader's cost is not measured,
    # as in bench/gpt_step); a few different batches so no step sees the previous one's data.
    g = torch.Generator(device="cpu").manual_seed(a.seed)
    batches = [torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(acc.device)
               for _ in range(4)]

    def step(i):
        x = batches[i % len(batches)]
        loss = model(input_ids=x, labels=x).loss
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    # Step boundaries: CUDA events recorded between steps (no synchronisation inside the
    # timed loop, so the host queues ahead as in real training), host clock on the CPU.
    if a.device == "cuda":
        def mark():
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e

        def seconds(e0, e1):
            return e0.elapsed_time(e1) / 1e3
        torch.cuda.reset_peak_memory_stats()
    else:
        mark = time.perf_counter

        def seconds(t0, t1):
            return t1 - t0

    t_start = time.perf_counter()
    first = None
    for i in range(a.warmup):
        loss = step(i)
        if first is None:
            first = loss.item()
    if a.device == "cuda":
        torch.cuda.synchronize()
    t_warm = time.perf_counter() - t_start
    marks = [mark()]
    for i in range(a.warmup, a.warmup + a.steps):
        loss = step(i)
        marks.append(mark())
    last = loss.item()  # waits for the last step
    if first is None:
        first = last
    times = [seconds(marks[j], marks[j + 1]) for j in range(a.steps)]
    # The median step, as bench/gpt_step reports.
    step_s = statistics.median(times)
    tokens_per_s = a.batch * a.seq / step_s

    if a.profile:
        try:
            print_profile(torch, lambda: step(a.warmup + a.steps), a.profile)
        except Exception as e:  # a diagnostic: the figures above stand without it
            print(f"torch_gpt2: profile failed: {e!r}", flush=True)

    if a.device == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**30
        where = f"{torch.cuda.get_device_name()}, peak = torch.cuda.max_memory_allocated"
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
        where = "cpu, peak = process max RSS"
    if not (math.isfinite(first) and math.isfinite(last)):
        print(f"torch_gpt2: loss is not finite (first {first}, last {last})", file=sys.stderr)
        return 1
    import accelerate
    import transformers
    print(f"torch_gpt2: {'torch.compile' if a.compile else 'eager'} {a.mixed_precision}, "
          f"{n_params / 1e6:.1f} M parameters, B={a.batch} T={a.seq}, {a.steps} steps after "
          f"{a.warmup} warm-up ({t_warm:.1f} s), median {step_s * 1e3:.2f} ms, mean "
          f"{statistics.fmean(times) * 1e3:.2f} ms, loss {first:.3f} -> {last:.3f}; {where}; "
          f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"accelerate {accelerate.__version__}", flush=True)
    print(f"tokens_per_s={tokens_per_s:.1f} peak_mem_gib={peak:.3f} step_ms={step_s * 1e3:.3f}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
