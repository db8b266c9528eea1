/* The load setup's ceiling: the least work a server can do per request, so that a benchmark
 * cell can tell how much of the measured rate the load generator itself allows.
 *
 * One thread, one epoll loop; per readable socket one recv(), a count of the complete request
 * heads in it (CRLF CRLF, bodiless GETs only), and one send() of as many canned responses. The
 * response is the same 200 a static server sends for the file given on the command line (the
 * same header lines larder sends, the file's bytes), so the load generator parses the same
 * amount. It is not an HTTP server: it understands no request and serves any path.
 *
 *   cc -O2 -o ceiling ceiling.c && ./ceiling PORT FILE     (listens on 127.0.0.1 only)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

static char resp[4096];
static int rlen;

static int load_response(const char *path) {
    char body[2048];
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(body, 1, sizeof body, f);
    fclose(f);
    int h = snprintf(resp, sizeof resp,
                     "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\n"
                     "etag: \"6b01a25a.3ac8d84f-64\"\r\n"
                     "last-modified: Sat, 21 Nov 2026 13:53:30 GMT\r\naccept-ranges: bytes\r\n"
                     "content-length: %zu\r\ndate: Sat, 21 Nov 2026 13:58:34 GMT\r\n\r\n", n);
    if (h < 0 || (size_t)h + n > sizeof resp) return -1;
    memcpy(resp + h, body, n);
    rlen = h + (int)n;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3 || load_response(argv[2]) != 0) {
        fprintf(stderr, "usage: ceiling PORT FILE (FILE up to 2 KiB)\n");
        return 2;
    }
    int one = 1, ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (void *)&a, sizeof a) || listen(ls, 4096)) {
        perror("ceiling: bind/listen");
        return 1;
    }
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls}, evs[512];
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    static char in[65536], out[65536];
    for (;;) {
        int n = epoll_wait(ep, evs, 512, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == ls) {
                int c;
                while ((c = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct epoll_event ce = {.events = EPOLLIN, .data.fd = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
                }
                continue;
            }
            ssize_t r = recv(fd, in, sizeof in, 0);
            if (r <= 0) {
                if (r == 0 || errno != EAGAIN) close(fd);
                continue;
            }
            int o = 0;
            for (ssize_t j = 3; j < r; j++)
                if (in[j] == '\n' && in[j - 1] == '\r' && in[j - 2] == '\n' && in[j - 3] == '\r' &&
                    o + rlen <= (int)sizeof out) {
                    memcpy(out + o, resp, rlen);
                    o += rlen;
                }
            if (o) send(fd, out, o, MSG_NOSIGNAL);
        }
    }
}
