/*
 * Gloo's own collectives for bench/collectives (see gloo_raw.h): a Gloo TCP context of its own,
 * connected through the job's accel store, and the calls PyTorch's gloo process group makes.
 * No exception leaves this file.
 */
#include "gloo_raw.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

extern "C" {
#include "comm/store.h"
}

namespace
{

/* Gloo's rendezvous store on the job's accel store, keys under "bench/gloo_raw/". */
class Store : public gloo::rendezvous::Store
{
  public:
    Store(accel__store *st, double timeout_s) : st_(st), timeout_s_(timeout_s) {}

    void set(const std::string &key, const std::vector<char> &data) override
    {
        check(accel__store_set(st_, name(key).c_str(), data.data(), data.size()));
    }

    std::vector<char> get(const std::string &key) override
    {
        std::vector<char> buf(ACCEL__STORE_VALUE_MAX);
        size_t n = 0;
        check(accel__store_get(st_, name(key).c_str(), buf.data(), buf.size(), &n, timeout_s_));
        buf.resize(n);
        return buf;
    }

    void wait(const std::vector<std::string> &keys) override
    {
        wait(keys, std::chrono::milliseconds((long long)(timeout_s_ * 1000)));
    }

    void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &t) override
    {
        std::vector<std::string> full;
        std::vector<const char *> ptrs;
        for (const auto &k : keys) {
            full.push_back(name(k));
        }
        for (const auto &k : full) {
            ptrs.push_back(k.c_str());
        }
        check(accel__store_wait(st_, ptrs.data(), ptrs.size(), (double)t.count() / 1000));
    }

  private:
    static std::string name(const std::string &key) { return "bench/gloo_raw/" + key; }

    static void check(accel_status st)
    {
        if (st != ACCEL_OK) {
            throw std::runtime_error(accel_last_error(nullptr));
        }
    }

    accel__store *st_;
    double timeout_s_;
};

/* The local address of the route to addr (where a connection to it would leave from). */
std::string route_to(const char *addr, int port)
{
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_DGRAM;
    if (getaddrinfo(addr, std::to_string(port).c_str(), &hints, &res) != 0) {
        throw std::runtime_error(std::string("cannot resolve ") + addr);
    }
    std::string out;
    for (addrinfo *a = res; a != nullptr && out.empty(); a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_DGRAM, 0);
        sockaddr_storage ss{};
        socklen_t len = sizeof(ss);
        char buf[INET6_ADDRSTRLEN];
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
            getsockname(fd, (sockaddr *)&ss, &len) == 0 &&
            getnameinfo((sockaddr *)&ss, len, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) == 0) {
            out = buf;
        }
        if (fd >= 0) {
            close(fd);
        }
    }
    freeaddrinfo(res);
    if (out.empty()) {
        throw std::runtime_error(std::string("no route to ") + addr);
    }
    return out;
}

} // namespace

struct bench_gloo {
    accel__store *store = nullptr;
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    uint32_t tag = 0;
    ~bench_gloo() { accel__store_close(store); }
};

extern "C" bench_gloo *bench_gloo_open(int rank, int n, const char *addr, int port,
                                       const char *ifname, double timeout_s)
{
    auto g = std::make_unique<bench_gloo>();
    try {
        accel__store_config sc{};
        sc.addr = addr;
        sc.port = port;
        sc.timeout_s = timeout_s;
        if (accel__store_open(&g->store, &sc) != ACCEL_OK) {
            throw std::runtime_error(accel_last_error(nullptr));
        }
        gloo::transport::tcp::attr attr;
        if (ifname != nullptr) {
            attr.iface = ifname;
        } else {
            attr.hostname = route_to(addr, port);
        }
        Store store(g->store, timeout_s);
        g->ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
        g->ctx->setTimeout(std::chrono::milliseconds((long long)(timeout_s * 1000)));
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        g->ctx->connectFullMesh(store, dev);
        return g.release();
    } catch (const std::exception &e) {
        fprintf(stderr, "bench gloo_raw: rank %d: cannot connect: %s\n", rank, e.what());
        return nullptr;
    }
}

extern "C" int bench_gloo_run(bench_gloo *g, int coll, const float *send, float *recv,
                              size_t count)
{
    float *in = const_cast<float *>(send);
    const size_t per = count / (size_t)g->ctx->size;
    try {
        switch (coll) {
        case 0: {
            gloo::AllreduceOptions o(g->ctx);
            o.setInput(in, count);
            o.setOutput(recv, count);
            void (*fn)(void *, const void *, const void *, size_t) = &gloo::sum<float>;
            o.setReduceFunction(fn);
            o.setTag(g->tag++);
            gloo::allreduce(o);
            return 0;
        }
        case 1: {
            gloo::AllgatherOptions o(g->ctx);
            o.setInput(in, per);
            o.setOutput(recv, per * (size_t)g->ctx->size);
            o.setTag(g->tag++);
            gloo::allgather(o);
            return 0;
        }
        case 3: {
            if (g->ctx->rank == 0) {
                memcpy(recv, send, count * sizeof(float));
            }
            gloo::BroadcastOptions o(g->ctx);
            o.setOutput(recv, count);
            o.setRoot(0);
            o.setTag(g->tag++);
            gloo::broadcast(o);
            return 0;
        }
        default:
            return 1;
        }
    } catch (const std::exception &e) {
        fprintf(stderr, "bench gloo_raw: rank %d: %s\n", g->ctx->rank, e.what());
        return -1;
    }
}

extern "C" void bench_gloo_close(bench_gloo *g)
{
    delete g;
}
