#!/usr/bin/env python3
"""RSS per idle keep-alive connection.

Starts larder (or attaches to a running server with --pid/--port), opens N keep-alive
connections to 127.0.0.1, sends one GET on each and reads the response, leaves them idle, and
reads the server's RSS from /proc before and after. Prints KiB per connection.

    bench/idle_conns.py --server target/profiling/larder --root bench/data -n 10000
"""
import argparse, asyncio, os, resource, socket, subprocess, sys, time
from pathlib import Path

def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

async def one(port, path, conns, sem):
    async with sem:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        head = await r.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await r.readexactly(length)
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head[:40])
        conns.append((r, w))

async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=10000)
    ap.add_argument("--server", help="larder binary to start")
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent / "data"))
    ap.add_argument("--workers", default="1")
    ap.add_argument("--pid", type=int); ap.add_argument("--port", type=int)
    ap.add_argument("--path", default="/small.html")
    ap.add_argument("--hold", type=float, default=2.0, help="seconds idle before measuring")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    proc = None
    if a.server:
        a.port = free_port()
        proc = subprocess.Popen([a.server, "--root", a.root, "--listen", f"127.0.0.1:{a.port}",
                                 "--workers", a.workers], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        a.pid = proc.pid
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", a.port), timeout=1).close(); break
            except OSError:
                time.sleep(0.05)
        # Warm up: the file is loaded into the cache, the allocator has its arenas.
        warm = []
        await asyncio.wait_for(asyncio.gather(*[one(a.port, a.path, warm, asyncio.Semaphore(100)) for _ in range(200)]), 30)
        for _, w in warm: w.close()
        await asyncio.sleep(1.0)
        before = rss_kib(a.pid)
        conns, sem = [], asyncio.Semaphore(500)
        t0 = time.time()
        await asyncio.wait_for(asyncio.gather(*[one(a.port, a.path, conns, sem) for _ in range(a.n)]), 120)
        opened = time.time() - t0
        await asyncio.sleep(a.hold)
        after = rss_kib(a.pid)
        per = (after - before) * 1024 / a.n
        print(f"connections={len(conns)} open_time={opened:.1f}s rss_before={before}KiB "
              f"rss_after={after}KiB per_conn={per/1024:.2f}KiB ({per:.0f} bytes)")
        for _, w in conns: w.close()
    finally:
        if proc:
            proc.terminate()
            try: proc.wait(5)
            except subprocess.TimeoutExpired: proc.kill()

asyncio.run(main())
