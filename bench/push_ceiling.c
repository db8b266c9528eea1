// push_ceiling: the least a push server can do, as a ceiling for the push benchmark
// (bench/push_bench.py): one thread, epoll, no parsing beyond finding a request's end.
//
//   push_ceiling PORT
//
// A `GET` gets an SSE response head (`text/event-stream`, the body delimited by the close) and
// becomes a subscriber. A `PUT` (or `POST`) with a Content-Length body is a publish: it gets
// `204` and its body goes to every subscriber as one event, `data: BODY\n\n`, by one send()
// per subscriber in a sweep over them. Publishes are read every 128 subscribers of a sweep:
// a new event goes to the rest of that sweep in the same send() as the events before it, and
// to the subscribers already passed in one more sweep (a server that keeps up writes each
// event alone; one that falls behind coalesces, as larder does). A subscriber whose socket is
// full is closed. Nothing is kept, logged or checked: what remains of a delivery's cost is
// the kernel's.
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_FD 65536
#define REQ 4096
#define OUT (1 << 20)

struct conn {
  int len;       // bytes of an unfinished request
  char sub;      // a subscriber
  char *req;     // the request being read (allocated for requests only)
};

static struct conn conns[MAX_FD];
static int subs[MAX_FD], nsubs;
static char out[OUT];
static int outlen;

static const char SSE_HEAD[] =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\r\n";
static const char NO_CONTENT[] = "HTTP/1.1 204 No Content\r\n\r\n";

static void drop(int ep, int fd) {
  epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
  close(fd);
  free(conns[fd].req);
  conns[fd] = (struct conn){0};
}

// Reads what fd has; handles every complete request in it. Returns -1 when fd closed.
static int serve(int ep, int fd) {
  struct conn *c = &conns[fd];
  if (!c->req) c->req = malloc(REQ);
  for (;;) {
    ssize_t n = recv(fd, c->req + c->len, REQ - 1 - c->len, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN)) return -1;
    if (n < 0) return 0;
    c->len += n;
    c->req[c->len] = 0;
    for (;;) {
      char *end = strstr(c->req, "\r\n\r\n");
      if (!end) break;
      int head = end + 4 - c->req;
      if (c->req[0] == 'G') {
        send(fd, SSE_HEAD, sizeof SSE_HEAD - 1, MSG_NOSIGNAL);
        c->sub = 1;
        subs[nsubs++] = fd;
        c->len = 0;
        free(c->req);
        c->req = NULL;
        return 0;
      }
      char *cl = strcasestr(c->req, "content-length:");
      int body = cl && cl < end ? atoi(cl + 15) : 0;
      if (c->len < head + body) break;
      if (outlen + 8 + body < OUT) {
        memcpy(out + outlen, "data: ", 6);
        memcpy(out + outlen + 6, c->req + head, body);
        memcpy(out + outlen + 6 + body, "\n\n", 2);
        outlen += 8 + body;
      }
      send(fd, NO_CONTENT, sizeof NO_CONTENT - 1, MSG_NOSIGNAL);
      memmove(c->req, c->req + head + body, c->len - head - body);
      c->len -= head + body;
      c->req[c->len] = 0;
    }
    if (c->len >= REQ - 1) return -1;
  }
}

static unsigned sent[MAX_FD];  // how much of `out` each subscriber has had
static int ep, ls;

static void accept_all(void) {
  int c, one = 1;
  while ((c = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
    if (c >= MAX_FD) {
      close(c);
      continue;
    }
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = c};
    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
  }
}

// Handles what epoll reported; inside a sweep (`sweeping`) only requests (publishes), so that
// the subscriber array stays as it is.
static void handle(struct epoll_event *evs, int n, int sweeping) {
  for (int i = 0; i < n; i++) {
    int fd = evs[i].data.fd;
    if (fd == ls) {
      if (!sweeping) accept_all();
    } else if (conns[fd].sub) {
      char buf[256];  // a subscriber only closes
      if (!sweeping && recv(fd, buf, sizeof buf, 0) <= 0) {
        for (int s = 0; s < nsubs; s++)
          if (subs[s] == fd) subs[s] = subs[--nsubs];
        drop(ep, fd);
      }
    } else if (serve(ep, fd) < 0) {
      drop(ep, fd);
    } else if (sweeping && conns[fd].sub) {
      sent[fd] = outlen;  // subscribed mid-sweep: from the next event on
    }
  }
}

static void sweep(void) {
  struct epoll_event evs[64];
  for (int behind = 1; behind;) {
    behind = 0;
    for (int s = 0; s < nsubs; s++) {
      int fd = subs[s];
      unsigned n = outlen - sent[fd];
      if (n && send(fd, out + sent[fd], n, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)n) {
        subs[s--] = subs[--nsubs];
        drop(ep, fd);
        continue;
      }
      sent[fd] = outlen;
      if ((s & 127) == 127) handle(evs, epoll_wait(ep, evs, 64, 0), 1);
    }
    for (int s = 0; s < nsubs; s++) behind |= sent[subs[s]] != (unsigned)outlen;
  }
  for (int s = 0; s < nsubs; s++) sent[subs[s]] = 0;
  outlen = 0;
}

int main(int argc, char **argv) {
  int port = argc > 1 ? atoi(argv[1]) : 18103, one = 1;
  ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                          .sin_addr.s_addr = htonl(0x7f000001)};
  if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 65535)) {
    perror("listen");
    return 1;
  }
  ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls}, evs[512];
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
  for (;;) {
    handle(evs, epoll_wait(ep, evs, 512, -1), 0);
    if (outlen) sweep();
  }
}
