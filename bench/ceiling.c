/* The load setup's ceiling: the least work a server can do per request, so that a benchmark
 * cell can tell how close a server comes to what the kernel and the load generator allow.
 *
 * One thread, one epoll loop. FILE holds one complete HTTP response, head and body, exactly
 * as a server under test sent it for the cell's request (bench/harness.py fetches it from
 * larder once per cell). Per readable socket one recv() and a count of the complete request
 * heads in it (CRLF CRLF, bodiless GETs only; a head split across reads is counted once);
 * then, per connection, that many copies of FILE's bytes are sent from the one buffer, one
 * send() per response, or one writev() when requests were pipelined. What the socket does not
 * take at once is sent when it becomes writable again (EPOLLOUT), so large bodies (140 KB)
 * are answered whole. It is not an HTTP server: it understands no request and serves any path.
 *
 * With a third argument `sendfile`, the body is sent the way larder sends a large stored body
 * (src/mapped.rs, src/socket.rs): kept in a sealed memfd, each response's head sent with
 * MSG_MORE and its body with sendfile(2) from the memfd, its pages handed to the socket without
 * a copy; one response per call pair, pipelined or not.
 *
 *   cc -O2 -o ceiling ceiling.c && ./ceiling PORT FILE [sendfile]  (listens on 127.0.0.1 only)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

static char *resp;
static size_t rlen;
static size_t hlen;  /* the head's bytes (through CRLF CRLF) */
static int body_fd = -1; /* sendfile mode: the body in a memfd */

struct conn {
    unsigned pending; /* responses owed, the first of them possibly begun */
    size_t off;       /* bytes of the first owed response already sent */
    unsigned char crlf; /* how much of "\r\n\r\n" the last bytes read matched */
    unsigned char out;  /* EPOLLOUT registered */
};
static struct conn *conns;
static size_t nconns;

static int load_response(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    if (fseek(f, 0, SEEK_END) != 0) return -1;
    long n = ftell(f);
    rewind(f);
    if (n <= 0 || !(resp = malloc((size_t)n))) return -1;
    rlen = fread(resp, 1, (size_t)n, f);
    fclose(f);
    char *end = rlen == (size_t)n ? memmem(resp, rlen, "\r\n\r\n", 4) : NULL;
    if (!end) return -1;
    hlen = (size_t)(end - resp) + 4;
    return 0;
}

/* sendfile mode: the body into a sealed memfd, as larder keeps a large body. */
static int body_to_memfd(void) {
    body_fd = memfd_create("ceiling-body", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (body_fd < 0 || rlen == hlen) return -1;
    for (size_t at = hlen; at < rlen;) {
        ssize_t w = write(body_fd, resp + at, rlen - at);
        if (w <= 0) return -1;
        at += (size_t)w;
    }
    return fcntl(body_fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK);
}

/* sendfile mode: the rest of the response begun at `off`: the head's rest with MSG_MORE, then
 * (if it all went) the body with sendfile. Bytes sent, or -1 (errno set). */
static ssize_t send_zero_copy(int fd, size_t off) {
    ssize_t sent = 0;
    if (off < hlen) {
        sent = send(fd, resp + off, hlen - off, MSG_NOSIGNAL | MSG_MORE);
        if (sent < (ssize_t)(hlen - off)) return sent;
        off = hlen;
    }
    off_t at = (off_t)(off - hlen);
    ssize_t w = sendfile(fd, body_fd, &at, rlen - off);
    if (w < 0) return sent > 0 ? sent : -1;
    return sent + w;
}

static void drop(int ep, int fd) {
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    memset(&conns[fd], 0, sizeof conns[fd]);
}

/* Send what connection fd owes; 0 when done or waiting for EPOLLOUT, -1 on a socket error. */
static int flush(int ep, int fd) {
    struct conn *c = &conns[fd];
    while (c->pending) {
        ssize_t w;
        if (body_fd >= 0) {
            w = send_zero_copy(fd, c->off);
        } else if (c->pending == 1) {
            w = send(fd, resp + c->off, rlen - c->off, MSG_NOSIGNAL);
        } else {
            struct iovec iov[64];
            int n = c->pending < 64 ? (int)c->pending : 64;
            iov[0].iov_base = resp + c->off;
            iov[0].iov_len = rlen - c->off;
            for (int i = 1; i < n; i++) {
                iov[i].iov_base = resp;
                iov[i].iov_len = rlen;
            }
            w = writev(fd, iov, n);
        }
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN) return -1;
            break;
        }
        size_t done = c->off + (size_t)w;
        c->pending -= (unsigned)(done / rlen);
        c->off = done % rlen;
    }
    int want = c->pending != 0;
    if (want != c->out) {
        struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.fd = fd};
        epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
        c->out = (unsigned char)want;
    }
    return 0;
}

int main(int argc, char **argv) {
    int zero_copy = argc == 4 && strcmp(argv[3], "sendfile") == 0;
    if ((argc != 3 && !zero_copy) || load_response(argv[2]) != 0) {
        fprintf(stderr, "usage: ceiling PORT FILE [sendfile] (FILE: one complete HTTP response)\n");
        return 2;
    }
    if (zero_copy && body_to_memfd() != 0) {
        perror("ceiling: memfd");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN); /* writev has no MSG_NOSIGNAL */
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    nconns = rl.rlim_cur == RLIM_INFINITY ? 1 << 20 : (size_t)rl.rlim_cur;
    conns = calloc(nconns, sizeof *conns);
    int one = 1, ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (!conns || bind(ls, (void *)&a, sizeof a) || listen(ls, 4096)) {
        perror("ceiling: bind/listen");
        return 1;
    }
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls}, evs[512];
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    static char in[65536];
    for (;;) {
        int n = epoll_wait(ep, evs, 512, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == ls) {
                int c;
                while ((c = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if ((size_t)c >= nconns) {
                        close(c);
                        continue;
                    }
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct epoll_event ce = {.events = EPOLLIN, .data.fd = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
                }
                continue;
            }
            if (evs[i].events & EPOLLOUT && flush(ep, fd) < 0) {
                drop(ep, fd);
                continue;
            }
            if (!(evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))) continue;
            ssize_t r = recv(fd, in, sizeof in, 0);
            if (r <= 0) {
                if (r == 0 || (errno != EAGAIN && errno != EINTR)) drop(ep, fd);
                continue;
            }
            struct conn *c = &conns[fd];
            unsigned heads = 0, m = c->crlf;
            for (ssize_t j = 0; j < r; j++) {
                char b = in[j];
                if (b == "\r\n\r\n"[m]) {
                    if (++m == 4) {
                        heads++;
                        m = 0;
                    }
                } else {
                    m = b == '\r';
                }
            }
            c->crlf = (unsigned char)m;
            if (heads) {
                int idle = c->pending == 0;
                c->pending += heads;
                if (idle && flush(ep, fd) < 0) drop(ep, fd);
            }
        }
    }
}
