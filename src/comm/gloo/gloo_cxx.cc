/*
 * The only C++ in accel: Gloo's API is C++, so this file wraps one Gloo TCP context behind the
 * C functions of gloo_cxx.h. It owns the store adapter (Gloo's rendezvous::Store on top of
 * accel's TCP store) and the translation of Gloo's exceptions into statuses that name the peer.
 *
 * Invariant: no exception leaves this file; every entry point catches everything.
 */
#include "gloo_cxx.h"

#include <dirent.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/allgatherv.h>
#include <gloo/alltoallv.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>

extern "C" {
#include "comm/store.h"
}

namespace
{

/* ACCEL_TIMEOUT as Gloo's milliseconds. Gloo refuses a negative count ("Invalid timeout"), which
 * a huge value (1e300: "wait as long as it takes") became by overflowing; a tiny one must not
 * round to 0. Clamped to [1 ms, 10^9 s]. */
std::chrono::milliseconds to_ms(double timeout_s)
{
    double ms = timeout_s * 1000.0;
    ms = ms < 1.0 ? 1.0 : ms > 1e12 ? 1e12 : ms;
    return std::chrono::milliseconds((long long)ms);
}

/* Gloo's rendezvous store on accel's: keys get the communicator's prefix; waits have the
 * communicator's deadline (Gloo's own default would be 30 s whatever ACCEL_TIMEOUT says). */
class StoreAdapter : public gloo::rendezvous::Store
{
  public:
    StoreAdapter(accel__store *st, std::string prefix, double timeout_s)
        : st_(st), prefix_(std::move(prefix)), timeout_s_(timeout_s)
    {
    }

    void set(const std::string &key, const std::vector<char> &data) override
    {
        check(accel__store_set(st_, (prefix_ + key).c_str(), data.data(), data.size()));
    }

    /* Waits as wait does: Gloo's rendezvous gets the keys of lower ranks ("rank_<q>") without
     * waiting for them first, and a process whose setup failed never sets its own. */
    std::vector<char> get(const std::string &key) override
    {
        wait({key});
        std::vector<char> buf(ACCEL__STORE_VALUE_MAX);
        size_t n = 0;
        check(accel__store_get(st_, (prefix_ + key).c_str(), buf.data(), buf.size(), &n, 0));
        buf.resize(n);
        return buf;
    }

    void wait(const std::vector<std::string> &keys) override
    {
        wait(keys, std::chrono::milliseconds(0));
    }

    /* Waits in slices, so that a process whose setup failed (it publishes "setup_failed", see
     * gloo.c) ends everyone's wait at once with its message instead of leaving them to the
     * deadline. The deadline is always the communicator's: Gloo passes its context's timeout,
     * which accel__gloo_connect shortens for the pairs' connections. */
    void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &) override
    {
        const std::chrono::milliseconds t = to_ms(timeout_s_);
        std::vector<std::string> full;
        std::vector<const char *> ptrs;
        for (const auto &k : keys) {
            full.push_back(prefix_ + k);
        }
        for (const auto &k : full) {
            ptrs.push_back(k.c_str());
        }
        const auto deadline = std::chrono::steady_clock::now() + t;
        for (;;) {
            auto left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now());
            double slice = left.count() < 0.5 ? left.count() : 0.5;
            accel_status st =
                accel__store_wait(st_, ptrs.data(), ptrs.size(), slice > 0 ? slice : 0);
            if (st != ACCEL_ETIMEDOUT && st != ACCEL_ENOTFOUND) {
                check(st);
                return;
            }
            const std::string missing = accel_last_error(nullptr); /* names the key */
            std::vector<char> why(1024);
            size_t n = 0;
            if (accel__store_get(st_, (prefix_ + "setup_failed").c_str(), why.data(),
                                 why.size() - 1, &n, 0) == ACCEL_OK) {
                status = ACCEL_EPEER;
                throw std::runtime_error(std::string(why.data(), n));
            }
            if (slice <= 0) {
                /* (The last slice's status is ENOTFOUND, and the probe's message names
                 * setup_failed: neither is what ran out.) */
                status = ACCEL_ETIMEDOUT;
                absent = absent_rank(keys, missing);
                char what[64];
                snprintf(what, sizeof(what), "the rendezvous timed out after %g s: ",
                         std::chrono::duration<double>(t).count());
                throw std::runtime_error(what + missing);
            }
        }
    }

    accel_status status = ACCEL_OK; /* the store's failure, when one ended the rendezvous */
    int absent = -1; /* after a timeout: the rank whose key was missing, when it names one */

  private:
    /* Gloo's keys for rank q are "<q>" (its addresses) and "rank_<q>" (its host name); the
     * store's message names the first key missing, with the prefix, in quotes. */
    int absent_rank(const std::vector<std::string> &keys, const std::string &msg) const
    {
        for (const auto &k : keys) {
            if (msg.find("\"" + prefix_ + k + "\"") == std::string::npos) {
                continue;
            }
            const std::string q = k.compare(0, 5, "rank_") == 0 ? k.substr(5) : k;
            if (!q.empty() && q.size() < 10 &&
                q.find_first_not_of("0123456789") == std::string::npos) {
                return std::stoi(q);
            }
        }
        return -1;
    }

    void check(accel_status st)
    {
        if (st != ACCEL_OK) {
            status = st;
            throw std::runtime_error(accel_last_error(nullptr));
        }
    }

    accel__store *st_;
    std::string prefix_;
    double timeout_s_;
};

/* Rank q's end of its connection with `rank`, from q's record in the store: the addresses of
 * q's pairs to every other rank, in rank order. */
gloo::transport::tcp::Address peer_address(StoreAdapter &store, int q, int rank, int n_ranks)
{
    std::vector<char> all = store.get(std::to_string(q));
    size_t each = all.size() / (size_t)(n_ranks - 1);
    size_t at = (size_t)(rank > q ? rank - 1 : rank) * each;
    std::vector<char> mine(all.begin() + (long)at, all.begin() + (long)(at + each));
    return gloo::transport::tcp::Address(mine);
}

/* The rank whose pair never connected, when Gloo's message is its "Connect timeout <address>"
 * (the peer's listening address for this rank, from its record), else -1. */
static int unconnected(StoreAdapter &store, const char *msg, int rank, int n_ranks)
{
    const char *at = strstr(msg, "Connect timeout ");
    if (at == nullptr) {
        return -1;
    }
    std::string addr(at + strlen("Connect timeout "));
    addr = addr.substr(0, addr.find_first_of(" \n"));
    for (int q = 0; q < n_ranks; q++) {
        try {
            if (q != rank && peer_address(store, q, rank, n_ranks).str() == addr) {
                return q;
            }
        } catch (...) {
            /* A record that cannot be read names nobody. */
        }
    }
    return -1;
}

/* Same family and address, and with `ports` the same port too. */
static bool same_address(const sockaddr *a, const sockaddr *b, bool ports)
{
    if (a->sa_family != b->sa_family) {
        return false;
    }
    if (a->sa_family == AF_INET) {
        auto x = reinterpret_cast<const sockaddr_in *>(a);
        auto y = reinterpret_cast<const sockaddr_in *>(b);
        return (!ports || x->sin_port == y->sin_port) && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    if (a->sa_family == AF_INET6) {
        auto x = reinterpret_cast<const sockaddr_in6 *>(a);
        auto y = reinterpret_cast<const sockaddr_in6 *>(b);
        return (!ports || x->sin6_port == y->sin6_port) &&
               memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) == 0;
    }
    return false;
}

bool same_endpoint(const sockaddr_storage &a, const sockaddr_storage &b)
{
    return same_address(reinterpret_cast<const sockaddr *>(&a),
                        reinterpret_cast<const sockaddr *>(&b), true);
}

/* How many of addrs are not addresses of this host's interfaces (in this network namespace):
 * all of them when the interfaces cannot be listed. */
static int count_remote(const std::vector<sockaddr_storage> &addrs)
{
    struct ifaddrs *all = nullptr;
    if (getifaddrs(&all) != 0) {
        return (int)addrs.size();
    }
    int remote = 0;
    for (const sockaddr_storage &a : addrs) {
        bool found = false;
        for (struct ifaddrs *i = all; i != nullptr && !found; i = i->ifa_next) {
            found = i->ifa_addr != nullptr &&
                    same_address(reinterpret_cast<const sockaddr *>(&a), i->ifa_addr, false);
        }
        remote += !found;
    }
    freeifaddrs(all);
    return remote;
}

/* After a failed rendezvous (Gloo's message is then "address family mismatch"): which peer
 * listens in another family than this rank, from the records in the store, or "". */
std::string family_clash(accel__store *st, const std::string &prefix, int rank, int n_ranks)
{
    /* q's end of its connection with `other`, from q's record (see peer_address). */
    auto end_of = [&](int q, int other, sockaddr_storage *out) {
        std::vector<char> all(ACCEL__STORE_VALUE_MAX);
        size_t n = 0;
        if (accel__store_get(st, (prefix + std::to_string(q)).c_str(), all.data(), all.size(), &n,
                             0) != ACCEL_OK ||
            n == 0) {
            return false;
        }
        size_t each = n / (size_t)(n_ranks - 1);
        size_t at = (size_t)(other > q ? other - 1 : other) * each;
        *out = gloo::transport::tcp::Address(
                   std::vector<char>(all.begin() + (long)at, all.begin() + (long)(at + each)))
                   .getSockaddr();
        return true;
    };
    auto name = [](const sockaddr_storage &a) { return a.ss_family == AF_INET6 ? "IPv6" : "IPv4"; };
    sockaddr_storage mine{}, theirs{};
    for (int q = 0; q < n_ranks && n_ranks > 1; q++) {
        if (q != rank && end_of(rank, q, &mine) && end_of(q, rank, &theirs) &&
            mine.ss_family != theirs.ss_family) {
            return std::string(" (a peer listens in ") + name(theirs) + " at " +
                   gloo::transport::tcp::Address(theirs).str() + ", this process in " + name(mine) +
                   " at " + gloo::transport::tcp::Address(mine).str() +
                   ": every process must listen in one family)";
        }
    }
    return "";
}

} // namespace

struct accel__gloo_ctx {
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    /* Each rank's names in Gloo's messages ("[addr]:port"): the listening address of its end
     * of our connection, and the remote address of the connected socket (Gloo names the peer
     * by the latter once connected). */
    std::vector<std::vector<std::string>> peers;
    /* The sockets of this context's connections (inodes), found right after connecting. */
    std::vector<ino_t> sockets;
    /* How many peers listen on an address that is not one of this host's. */
    int remote_peers = 0;
    uint32_t tag = 0;
    std::chrono::milliseconds timeout;
    /* The current batch of point-to-point messages (accel__gloo_post), and its slots' base. */
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> msgs;
    std::vector<char> msg_is_send;
    std::vector<int> msg_peer; /* the other end of each message: a timed-out wait names it */
    uint64_t msg_base = 0;
};

/* Calls f(fd, inode, local address, remote address) for every connected socket of this
 * process. */
template <typename F> static void for_each_socket(F f)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == nullptr) {
        return;
    }
    for (struct dirent *e; (e = readdir(d)) != nullptr;) {
        int fd = atoi(e->d_name);
        struct stat st;
        if (e->d_name[0] == '.' || fd == dirfd(d) || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
            continue;
        }
        sockaddr_storage mine{}, theirs{};
        socklen_t a = sizeof(mine), b = sizeof(theirs);
        if (getsockname(fd, (sockaddr *)&mine, &a) == 0 &&
            getpeername(fd, (sockaddr *)&theirs, &b) == 0) {
            f(fd, st.st_ino, mine, theirs);
        }
    }
    closedir(d);
}

static void set_err(accel__gloo_err *err, const char *what, int peer, int timeout)
{
    snprintf(err->msg, sizeof(err->msg), "%s", what);
    err->peer = peer;
    err->timeout = timeout;
    err->unconnected = 0;
}

/* The rank whose address Gloo's message names ("Connection closed by peer [10.0.0.2]:41234"),
 * or -1. */
static int peer_in(const accel__gloo_ctx *g, const char *msg)
{
    for (size_t q = 0; q < g->peers.size(); q++) {
        for (const std::string &a : g->peers[q]) {
            const char *at = strstr(msg, a.c_str());
            if (at != nullptr && !(at[a.size()] >= '0' && at[a.size()] <= '9')) {
                return (int)q;
            }
        }
    }
    return -1;
}

/* Runs f, turning Gloo's exceptions into a status with err set. */
template <typename F> static accel_status guard(accel__gloo_ctx *g, accel__gloo_err *err, F f)
{
    try {
        f();
        return ACCEL_OK;
    } catch (const gloo::IoException &e) {
        const char *m = e.what();
        int timeout = strstr(m, "Timed out") != nullptr || strstr(m, "timeout") != nullptr;
        set_err(err, m, peer_in(g, m), timeout);
        return timeout ? ACCEL_ETIMEDOUT : ACCEL_EPEER;
    } catch (const std::exception &e) {
        set_err(err, e.what(), -1, 0);
        return ACCEL_EIO;
    } catch (...) {
        set_err(err, "unknown C++ exception in Gloo", -1, 0);
        return ACCEL_EINTERNAL;
    }
}

extern "C" accel_status accel__gloo_connect(accel__gloo_ctx **out, accel__store *store,
                                            const char *prefix, int rank, int n_ranks,
                                            const char *host, double timeout_s,
                                            accel__gloo_err *err)
{
    accel__gloo_ctx *g = nullptr;
    StoreAdapter adapter(store, prefix, timeout_s);
    accel_status st = ACCEL_OK;
    try {
        g = new accel__gloo_ctx;
        g->timeout = to_ms(timeout_s);
        gloo::transport::tcp::attr attr;
        /* Numeric: gloo.c chose the address, a named interface's too. */
        attr.hostname = host;
        std::vector<ino_t> before; /* sockets that are not this context's */
        for_each_socket([&](int, ino_t ino, const sockaddr_storage &, const sockaddr_storage &) {
            before.push_back(ino);
        });
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        g->ctx = std::make_shared<gloo::rendezvous::Context>(rank, n_ranks);
        /* The pairs take the context's timeout, and a pair waits 5 times that for its peer to
         * connect (Gloo's "longer timeout when waiting for initial connect"): with a stopped
         * or dead peer, 5 x ACCEL_TIMEOUT. A fifth keeps that wait to ACCEL_TIMEOUT; nothing
         * else uses the pairs' timeout in async mode (the collectives pass theirs). */
        g->ctx->setTimeout(to_ms(timeout_s / 5));
        g->ctx->connectFullMesh(adapter, dev);
        g->ctx->setTimeout(g->timeout);
        g->peers.resize((size_t)n_ranks);
        /* Which sockets are this context's: new since before the rendezvous, and with one end
         * at a listening address of a pair (ours, or the peer's for that pair). Gloo names a
         * peer in its messages by the remote address of that socket. */
        std::vector<std::pair<sockaddr_storage, int>> ends;
        std::vector<sockaddr_storage> listening; /* the peers' listening addresses */
        for (int q = 0; q < n_ranks; q++) {
            if (q != rank) {
                auto peer = peer_address(adapter, q, rank, n_ranks);
                g->peers[(size_t)q].push_back(peer.str());
                listening.push_back(peer.getSockaddr());
                ends.push_back({peer.getSockaddr(), q});
                auto &self = dynamic_cast<const gloo::transport::tcp::Address &>(
                    g->ctx->getPair(q)->address());
                ends.push_back({self.getSockaddr(), q});
            }
        }
        g->remote_peers = count_remote(listening);
        for_each_socket(
            [&](int, ino_t ino, const sockaddr_storage &mine, const sockaddr_storage &theirs) {
                if (std::find(before.begin(), before.end(), ino) != before.end()) {
                    return;
                }
                for (const auto &end : ends) {
                    if (same_endpoint(end.first, mine) || same_endpoint(end.first, theirs)) {
                        g->sockets.push_back(ino);
                        g->peers[(size_t)end.second].push_back(
                            gloo::transport::tcp::Address(theirs).str());
                        return;
                    }
                }
            });
    } catch (const std::exception &e) {
        std::string clash;
        if (adapter.status == ACCEL_OK) {
            try {
                clash = family_clash(store, prefix, rank, n_ranks);
            } catch (...) {
                /* A record that cannot be read says nothing more. */
            }
        }
        st = adapter.status != ACCEL_OK ? adapter.status : ACCEL_EIO;
        int absent = st == ACCEL_ETIMEDOUT && adapter.absent < n_ranks ? adapter.absent : -1;
        if (st == ACCEL_EIO && (absent = unconnected(adapter, e.what(), rank, n_ranks)) >= 0) {
            st = ACCEL_ETIMEDOUT;
        }
        set_err(err, (e.what() + clash).c_str(), absent, st == ACCEL_ETIMEDOUT);
        err->unconnected = adapter.status == ACCEL_OK && absent >= 0;
    } catch (...) {
        set_err(err, "unknown C++ exception in Gloo", -1, 0);
        st = ACCEL_EINTERNAL;
    }
    if (st != ACCEL_OK) {
        delete g;
        return st;
    }
    *out = g;
    return ACCEL_OK;
}

extern "C" int accel__gloo_remote_peers(const accel__gloo_ctx *g)
{
    return g->remote_peers;
}

extern "C" void accel__gloo_free(accel__gloo_ctx *g)
{
    try {
        delete g;
    } catch (...) {
        /* A destructor that throws has nothing left to tell us. */
    }
}

extern "C" accel_status accel__gloo_alltoallv(accel__gloo_ctx *g, const void *send,
                                              const size_t *send_nbytes, void *recv,
                                              const size_t *recv_nbytes, accel__gloo_err *err)
{
    return guard(g, err, [&] {
        const int n = g->ctx->size;
        std::vector<int64_t> sn(send_nbytes, send_nbytes + n), rn(recv_nbytes, recv_nbytes + n);
        gloo::AlltoallvOptions o(g->ctx);
        o.setInput(const_cast<uint8_t *>(static_cast<const uint8_t *>(send)), sn);
        o.setOutput(static_cast<uint8_t *>(recv), rn);
        o.setTag(g->tag++);
        o.setTimeout(g->timeout);
        gloo::alltoallv(o);
    });
}

extern "C" void accel__gloo_msgs_begin(accel__gloo_ctx *g)
{
    /* The last batch's messages were all waited for: gloo.c begins no batch on a context
     * that failed (it is broken for good, and keeps the messages until freed). Slots: a byte
     * of our own above Gloo's collectives' prefixes, the tag, then the caller's key. */
    g->msgs.clear();
    g->msg_is_send.clear();
    g->msg_peer.clear();
    g->msg_base = (uint64_t)0x7e << 56 | (uint64_t)(g->tag++ & 0xffffffu) << 32;
}

extern "C" accel_status accel__gloo_post(accel__gloo_ctx *g, int is_send, int peer, uint32_t key,
                                         void *buf, size_t nbytes, size_t *index,
                                         accel__gloo_err *err)
{
    return guard(g, err, [&] {
        auto b = g->ctx->createUnboundBuffer(buf, nbytes);
        if (is_send) {
            b->send(peer, g->msg_base | key, 0, nbytes);
        } else {
            b->recv(peer, g->msg_base | key, 0, nbytes);
        }
        *index = g->msgs.size();
        g->msgs.push_back(std::move(b));
        g->msg_is_send.push_back((char)is_send);
        g->msg_peer.push_back(peer);
    });
}

extern "C" accel_status accel__gloo_wait(accel__gloo_ctx *g, size_t index, accel__gloo_err *err)
{
    accel_status st = guard(g, err, [&] {
        auto &b = g->msgs.at(index);
        if (!(g->msg_is_send[index] ? b->waitSend(g->timeout) : b->waitRecv(g->timeout))) {
            throw std::runtime_error("gloo: a point-to-point message was aborted");
        }
    });
    /* Gloo's timeout message names no address ("Timed out waiting 3000ms for recv operation
     * to complete"), but the message's other end is the process this wait is stuck on. */
    if (st == ACCEL_ETIMEDOUT && err->peer < 0 && index < g->msg_peer.size()) {
        err->peer = g->msg_peer[index];
    }
    return st;
}

extern "C" int accel__gloo_arrived(accel__gloo_ctx *g, size_t index)
{
    /* A zero wait: true at once for a completed message, even once the context has failed (a
     * timed-out wait signals an exception to the pending ones only); else it throws. */
    try {
        auto &b = g->msgs.at(index);
        const std::chrono::milliseconds now(0);
        return g->msg_is_send[index] ? b->waitSend(now) : b->waitRecv(now);
    } catch (...) {
        return 0;
    }
}

extern "C" accel_status accel__gloo_allgatherv(accel__gloo_ctx *g, const void *send, void *recv,
                                               const size_t *nbytes, accel__gloo_err *err)
{
    return guard(g, err, [&] {
        gloo::AllgathervOptions o(g->ctx);
        if (send != nullptr) {
            o.setInput(const_cast<uint8_t *>(static_cast<const uint8_t *>(send)),
                       nbytes[g->ctx->rank]);
        }
        o.setOutput(static_cast<uint8_t *>(recv),
                    std::vector<size_t>(nbytes, nbytes + g->ctx->size));
        o.setTag(g->tag++);
        o.setTimeout(g->timeout);
        gloo::allgatherv(o);
    });
}

extern "C" accel_status accel__gloo_broadcast(accel__gloo_ctx *g, void *buf, size_t nbytes,
                                              int root, accel__gloo_err *err)
{
    return guard(g, err, [&] {
        gloo::BroadcastOptions o(g->ctx);
        o.setOutput(static_cast<uint8_t *>(buf), nbytes);
        o.setRoot(root);
        o.setTag(g->tag++);
        o.setTimeout(g->timeout);
        gloo::broadcast(o);
    });
}

extern "C" accel_status accel__gloo_gather(accel__gloo_ctx *g, const void *send, size_t nbytes,
                                           void *recv, int root, accel__gloo_err *err)
{
    return guard(g, err, [&] {
        gloo::GatherOptions o(g->ctx);
        o.setInput(const_cast<uint8_t *>(static_cast<const uint8_t *>(send)), nbytes);
        if (g->ctx->rank == root) {
            o.setOutput(static_cast<uint8_t *>(recv), nbytes * (size_t)g->ctx->size);
        }
        o.setRoot(root);
        o.setTag(g->tag++);
        o.setTimeout(g->timeout);
        gloo::gather(o);
    });
}

/* Gloo's TCP pair has no public way to fail a wait from another thread, and closing a pair
 * only unregisters it. Shutting its socket down does both halves: the local event loop reads
 * end-of-file (failing every wait on the pair here) and the peer reads it too. */
extern "C" void accel__gloo_break(accel__gloo_ctx *g)
{
    try {
        for_each_socket([&](int fd, ino_t ino, const sockaddr_storage &, const sockaddr_storage &) {
            if (std::find(g->sockets.begin(), g->sockets.end(), ino) != g->sockets.end()) {
                shutdown(fd, SHUT_RDWR);
            }
        });
    } catch (...) {
        /* Breaking is best effort: a connection that failed already is closed. */
    }
}
