/*
 * gpt_logits: the logits of the nn GPT for a fixed byte sequence, for the GPT-2 interop test.
 *
 *     gpt_logits --dir DIR --layers 2 --width 64 --heads 4 --context 32 --tied 1
 *                --activation gelu_new --tokens FILE --batch 2 --out logits.npy
 *
 * Builds the GPT the way examples/gpt.c does from the flags (deliberately not from
 * DIR/config.json: the Python reference reads that file, so a config.json that disagrees with
 * the model the example trained makes the two sides differ), loads DIR/model.safetensors with
 * accel_load_model in strict mode (every name and shape must match), and runs one forward
 * pass in eval mode without grad over the first batch x context bytes of FILE. Writes the
 * input ids (int32 [B, T]) and the logits (float32 [B, T, 256]) as .npy files. --device cuda
 * loads the weights into a model on the process's GPU and computes there (tests/gpu).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <accel/accel.h>
#include <accel/nn.h>

/* A version 1.0 .npy file: magic, header dict padded with spaces to a 64-byte boundary. */
static int write_npy(const char *path, const char *descr, const void *data, size_t nbytes, int ndim,
                     const int64_t *shape)
{
    char dict[256], dims[128] = "";
    size_t len = 0;
    for (int i = 0; i < ndim; i++) {
        len += (size_t)snprintf(dims + len, sizeof dims - len, "%lld%s", (long long)shape[i],
                                ndim == 1 || i < ndim - 1 ? ", " : "");
    }
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                     descr, dims);
    size_t total = 10 + (size_t)n + 1, pad = (64 - total % 64) % 64;
    unsigned short hlen = (unsigned short)((size_t)n + pad + 1);
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        return -1;
    }
    unsigned char head[10] = {0x93,
                              'N',
                              'U',
                              'M',
                              'P',
                              'Y',
                              1,
                              0,
                              (unsigned char)(hlen & 0xff),
                              (unsigned char)(hlen >> 8)};
    fwrite(head, 1, sizeof head, f);
    fwrite(dict, 1, (size_t)n, f);
    for (size_t i = 0; i < pad; i++) {
        fputc(' ', f);
    }
    fputc('\n', f);
    fwrite(data, 1, nbytes, f);
    return fclose(f) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    int layers = 2, width = 64, heads = 4, context = 32, tied = 1, batch = 2;
    const char *dir = NULL, *tokens = NULL, *out = NULL, *ids_out = NULL, *act = "gelu_new";
    const char *device = "cpu";
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *f = argv[i], *v = argv[i + 1];
        if (strcmp(f, "--dir") == 0) {
            dir = v;
        } else if (strcmp(f, "--tokens") == 0) {
            tokens = v;
        } else if (strcmp(f, "--out") == 0) {
            out = v;
        } else if (strcmp(f, "--ids_out") == 0) {
            ids_out = v;
        } else if (strcmp(f, "--activation") == 0) {
            act = v;
        } else if (strcmp(f, "--device") == 0) {
            device = v;
        } else if (strcmp(f, "--layers") == 0) {
            layers = atoi(v);
        } else if (strcmp(f, "--width") == 0) {
            width = atoi(v);
        } else if (strcmp(f, "--heads") == 0) {
            heads = atoi(v);
        } else if (strcmp(f, "--context") == 0) {
            context = atoi(v);
        } else if (strcmp(f, "--tied") == 0) {
            tied = atoi(v);
        } else if (strcmp(f, "--batch") == 0) {
            batch = atoi(v);
        } else {
            fprintf(stderr, "gpt_logits: unknown option %s\n", f);
            return 2;
        }
    }
    int on_gpu = strcmp(device, "cuda") == 0;
    if (dir == NULL || tokens == NULL || out == NULL || ids_out == NULL || batch < 1 ||
        context < 1 || (!on_gpu && strcmp(device, "cpu") != 0)) {
        fprintf(stderr, "usage: gpt_logits --dir DIR --tokens FILE --out LOGITS.npy --ids_out "
                        "IDS.npy [--layers --width --heads --context --tied --activation "
                        "--batch --device cpu|cuda]\n");
        return 2;
    }

    /* The token ids: the first batch x context bytes of the file. */
    size_t n_ids = (size_t)batch * (size_t)context;
    int32_t *ids = malloc(n_ids * sizeof(int32_t));
    FILE *tf = fopen(tokens, "rb");
    ACCEL_CHECK(ids && tf ? ACCEL_OK : ACCEL_EIO);
    for (size_t i = 0; i < n_ids; i++) {
        int c = fgetc(tf);
        if (c == EOF) {
            fprintf(stderr, "gpt_logits: %s has fewer than %zu bytes\n", tokens, n_ids);
            return 1;
        }
        ids[i] = c;
    }
    fclose(tf);

    accel *acc = NULL;
    ACCEL_CHECK(accel_init(&acc, NULL));
    if (on_gpu && accel_device_of(acc).type != ACCEL_DEVICE_CUDA) {
        fprintf(stderr, "gpt_logits: --device cuda: accel runs on %s here\n",
                accel_device_name(acc));
        return 1;
    }
    nn_gpt_config cfg = nn_gpt_config_default();
    cfg.n_layer = layers;
    cfg.n_head = heads;
    cfg.n_embd = width;
    cfg.block_size = context;
    cfg.vocab_size = 256;
    cfg.tied = tied;
    cfg.act = strcmp(act, "gelu") == 0 ? NN_ACT_GELU : NN_ACT_GELU_TANH;
    cfg.dropout = 0.0f;
    accel_model *model = NULL;
    nn_params *params = NULL;
    nn_gpt *gpt = NULL;
    ACCEL_CHECK(accel_model_new(acc, &model));
    if (!on_gpu) { /* a CUDA build would put it on the GPU */
        ACCEL_CHECK(accel_model_set_device(model, (accel_device){ACCEL_DEVICE_CPU, 0}));
    }
    ACCEL_CHECK(nn_params_for_model(&params, model));
    ACCEL_CHECK(nn_gpt_declare(&gpt, params, &cfg));
    ACCEL_CHECK(nn_params_bind(params));
    ACCEL_CHECK(accel_load_model(acc, model, dir, 1));

    nn_ctx *g = NULL;
    ACCEL_CHECK(nn_ctx_new(&g));
    ACCEL_CHECK(
        nn_ctx_set_device(g, on_gpu ? accel_device_of(acc) : (accel_device){ACCEL_DEVICE_CPU, 0}));
    nn_ctx_set_grad_enabled(g, 0);
    nn_ctx_set_training(g, 0);
    nn_tensor *logits = NULL;
    ACCEL_CHECK(nn_gpt_forward(g, gpt, ids, NULL, batch, context, &logits, NULL));
    int64_t shape[3] = {batch, context, 256};
    float *host = malloc((size_t)nn_numel(logits) * sizeof(float));
    ACCEL_CHECK(host ? nn_tensor_to_host(logits, host) : ACCEL_ENOMEM);
    if (write_npy(out, "<f4", host, (size_t)nn_numel(logits) * sizeof(float), 3, shape) != 0 ||
        write_npy(ids_out, "<i4", ids, n_ids * sizeof(int32_t), 2, shape) != 0) {
        fprintf(stderr, "gpt_logits: cannot write %s / %s\n", out, ids_out);
        return 1;
    }
    printf("gpt_logits: %d x %d tokens -> %s\n", batch, context, out);

    nn_ctx_free(g);
    nn_gpt_free(gpt);
    nn_params_free(params);
    accel_free(acc);
    free(ids);
    free(host);
    return 0;
}
