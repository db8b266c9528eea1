"""The benchmark harness's parts, imported by bench/harness.py (bench/run's command line) and by
the scenarios that run on their own (push_bench.py, tiers_bench.py, as `import lib as H`); the
package imports none of them.

A ladder: each module imports only those above it in this list (bench/lib/test_imports.py checks
that no bench module imports one that imports it back).

- common: paths, ports, CPUs, the time budget, the log.
- processes: commands, /proc CPU and RSS accounting, `Procs` (children stopped on exit).
- probes: HTTP requests and waits against a running server.
- quality: SSIM of a transformed image against a float reference downscale (numpy, Pillow).
- builds: bench/.venv installs, larder's release build, versions, machine facts.
- environment: `System` and `Env` (the origin and every system under test, started on demand).
- scenarios: the cells, their goals, the time plan.
- report: markdown, charts, docs/benchmarks.md's results section, results files.
- runners: a cell's checks and wrk/h2load runs, measured and summarized.
"""

from .common import *  # noqa: F401,F403
from .processes import *  # noqa: F401,F403
from .probes import *  # noqa: F401,F403
from .quality import *  # noqa: F401,F403
from .builds import *  # noqa: F401,F403
from .environment import *  # noqa: F401,F403
from .scenarios import *  # noqa: F401,F403
from .report import *  # noqa: F401,F403
from .runners import *  # noqa: F401,F403
