// sse_client: many Server-Sent Events subscribers on one thread (epoll), for the push
// benchmark (bench/harness.py, scenario push). It counts deliveries and their latency.
//
//   sse_client PORT PATH CONNS EXPECTED TIMEOUT_S
//
// Opens CONNS connections to 127.0.0.1:PORT, sends `GET PATH` with Accept: text/event-stream
// on each, and once every one has its response head prints "ready" on stdout. From then on
// every `"t":DIGITS` in any stream is one delivered message, stamped by the publisher with its
// CLOCK_REALTIME in microseconds: its latency is now minus that. It stops when EXPECTED
// messages have arrived in all, when nothing has arrived for 5 s after the first, or after
// TIMEOUT_S, and prints one JSON line: delivered, latency percentiles (ms), the time from the
// first to the last delivery, the fewest and most messages one connection got, and its own
// CPU time.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CARRY 48
#define BUCKET_US 100
#define BUCKETS 200000 /* 20 s */

struct conn {
  int fd;
  int head_done;
  uint32_t got;
  int carry_len;
  char carry[CARRY];
};

static uint64_t now_us(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + ts.tv_nsec / 1000;
}

static uint32_t hist[BUCKETS];
static uint64_t delivered, first_us, last_us;

static void record(uint64_t t) {
  uint64_t now = now_us(CLOCK_REALTIME);
  uint64_t lat = now > t ? now - t : 0;
  uint64_t b = lat / BUCKET_US;
  if (b >= BUCKETS) b = BUCKETS - 1;
  hist[b]++;
  delivered++;
  if (!first_us) first_us = now;
  last_us = now;
}

static double pct(double p) {
  if (!delivered) return 0;
  uint64_t want = (uint64_t)(p * delivered), seen = 0;
  for (int i = 0; i < BUCKETS; i++) {
    seen += hist[i];
    if (seen > want) return (i + 0.5) * BUCKET_US / 1000.0;
  }
  return BUCKETS * BUCKET_US / 1000.0;
}

// Scans buf for complete `"t":DIGITS` tokens; returns where an incomplete one starts (or
// the last few bytes, which may begin one), to carry to the next read.
static size_t scan(struct conn *c, const char *buf, size_t n) {
  size_t i = 0, keep = n > 3 ? n - 3 : 0;
  while (i + 4 <= n) {
    const char *p = memmem(buf + i, n - i, "\"t\":", 4);
    if (!p) break;
    size_t at = p - buf, j = at + 4;
    while (j < n && buf[j] == ' ') j++;
    uint64_t t = 0;
    while (j < n && buf[j] >= '0' && buf[j] <= '9') t = t * 10 + (buf[j++] - '0');
    if (j == n) return at; /* digits may continue in the next read */
    record(t);
    c->got++;
    i = j;
    keep = n > 3 ? n - 3 : 0;
    if (keep < i) keep = i;
  }
  return keep;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: %s PORT PATH CONNS EXPECTED TIMEOUT_S\n", argv[0]);
    return 2;
  }
  int port = atoi(argv[1]), nconns = atoi(argv[3]);
  const char *path = argv[2];
  uint64_t expected = strtoull(argv[4], 0, 10);
  uint64_t timeout_us = strtoull(argv[5], 0, 10) * 1000000u;
  char req[512];
  int reqlen = snprintf(req, sizeof req,
                        "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAccept: text/event-stream\r\n\r\n",
                        path, port);
  struct conn *conns = calloc(nconns, sizeof *conns);
  int ep = epoll_create1(0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  for (int i = 0; i < nconns; i++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
      fprintf(stderr, "connect %d: %s\n", i, strerror(errno));
      return 1;
    }
    if (write(fd, req, reqlen) != reqlen) {
      fprintf(stderr, "write %d: %s\n", i, strerror(errno));
      return 1;
    }
    fcntl(fd, F_SETFL, O_NONBLOCK);
    conns[i].fd = fd;
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  }
  // SSE_CLIENT_SPIN=1: never sleep in epoll_wait (the client's CPU is its own), so that the
  // server's sends do not pay for waking it (on loopback the receiver's wake-up is charged to
  // the sender).
  const char *spin_env = getenv("SSE_CLIENT_SPIN");
  int spin = spin_env && *spin_env == '1';
  int heads = 0, ready = 0, closed = 0;
  uint64_t start = now_us(CLOCK_MONOTONIC), last_progress = 0;
  static char buf[CARRY + 65536];
  struct epoll_event evs[256];
  for (;;) {
    uint64_t now = now_us(CLOCK_MONOTONIC);
    if (now - start > timeout_us) break;
    if (ready && delivered >= expected) break;
    if (delivered && now - last_progress > 5000000u) break;
    if (!ready && heads == nconns) {
      printf("ready\n");
      fflush(stdout);
      ready = 1;
    }
    int n = epoll_wait(ep, evs, 256, spin && ready ? 0 : 100);
    for (int k = 0; k < n; k++) {
      struct conn *c = &conns[evs[k].data.u32];
      for (;;) {
        memcpy(buf, c->carry, c->carry_len);
        ssize_t r = read(c->fd, buf + c->carry_len, sizeof buf - c->carry_len);
        if (r == 0 || (r < 0 && errno != EAGAIN)) {
          epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, 0);
          closed++;
          break;
        }
        if (r < 0) break;
        size_t len = c->carry_len + r, from = 0;
        if (!c->head_done) {
          char *e = memmem(buf, len, "\r\n\r\n", 4);
          if (!e) {
            c->carry_len = len < CARRY ? len : 0; /* heads are short; keep scanning */
            if (len < CARRY) memcpy(c->carry, buf, len);
            continue;
          }
          if (memcmp(buf, "HTTP/1.1 200", 12) != 0) {
            fprintf(stderr, "subscribe failed: %.*s\n", (int)(e - buf), buf);
            return 1;
          }
          c->head_done = 1;
          heads++;
          from = e + 4 - buf;
        }
        uint64_t before = delivered;
        size_t keep = from + scan(c, buf + from, len - from);
        if (delivered != before) last_progress = now_us(CLOCK_MONOTONIC);
        size_t carry = len - keep;
        if (carry > CARRY) carry = 0; /* not a token: drop */
        memmove(c->carry, buf + keep, carry);
        c->carry_len = carry;
        if ((size_t)r < sizeof buf - CARRY) break; /* drained: no second read for EAGAIN */
      }
    }
  }
  uint32_t lo = UINT32_MAX, hi = 0;
  for (int i = 0; i < nconns; i++) {
    if (conns[i].got < lo) lo = conns[i].got;
    if (conns[i].got > hi) hi = conns[i].got;
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
               ru.ru_stime.tv_usec / 1e6;
  printf("{\"ready\":%d,\"heads\":%d,\"closed\":%d,\"delivered\":%llu,\"expected\":%llu,"
         "\"p50_ms\":%.2f,\"p99_ms\":%.2f,\"max_ms\":%.2f,\"span_s\":%.4f,\"min_per_conn\":%u,"
         "\"max_per_conn\":%u,\"client_cpu_s\":%.3f}\n",
         ready, heads, closed, (unsigned long long)delivered, (unsigned long long)expected,
         pct(0.50), pct(0.99), pct(0.99999), (last_us - first_us) / 1e6, lo, hi, cpu);
  return 0;
}
