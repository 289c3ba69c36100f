"""Fresh Python processes for the tests, without paying torch's and JAX's import each time.

Many tests run code in a new interpreter: the first call of a process, plugins found through
their entry points, environment variables read at start-up, XLA with several simulated devices,
the examples and the docs' code blocks: about 60 interpreters per run. Each spent most of its
time importing torch and JAX (a small op in a new interpreter: 12.2 CPU-seconds, 4.8 of them
in a forked child; measured on the loaded 2-core machine).

``run`` gives the same process, minus those two imports: a server process per pytest worker
(one per set of start-up environment variables) imports ``torch`` and ``jax`` once, and forks
a child per call. The child is a new process whose torchlax, plugins and everything else are
imported by the code it runs, as in a new interpreter; JAX has created no backend before the
fork (so no XLA thread is forked, and ``XLA_FLAGS`` set for the call is read by the child), and
no torchlax module is loaded in the server. A test about what importing torch or JAX does
(what an import pulls in, code that must run without torch) uses ``subprocess`` directly.

Variables that torch or JAX read when imported (``XLA_FLAGS``, ``JAX_*``, ``PYTHON*``, ...)
pick the server: a call whose environment differs from every running server's, other than in
``TORCHLAX_*``, ``PYTEST_*`` and ``PYTHONPATH`` (applied in the child), gets a server of its own.
"""

from __future__ import annotations

import atexit
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
from collections import OrderedDict
from collections.abc import Mapping, Sequence

# Applied in the forked child only: read by torchlax (imported by the child) or by pytest
# (``PYTEST_CURRENT_TEST`` changes with every test), not by the preloaded torch and JAX.
_CHILD_ONLY = ("TORCHLAX_", "PYTHONPATH", "PYTEST_")

_SERVER = r"""
import os, pickle, runpy, signal, struct, sys, time, types
import jax, jax.numpy, numpy, torch  # what every child would import first (no XLA backend yet)

requests, replies = sys.stdin.buffer, sys.stdout.buffer
base_path = list(sys.path)


def child(argv, env, cwd, out_path, err_path):
    os.setpgid(0, 0)  # its own process group, so a timeout ends everything it started
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, out_path), (2, err_path)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_TRUNC), fd)
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    code = 0
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[:] = ["", *extra, *base_path[1:]]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file first
            sys.path[:] = [os.getcwd(), *extra, *base_path[1:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *extra, *base_path[1:]]
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:
        sys.excepthook(*sys.exc_info())  # as the interpreter reports an uncaught exception
        code = 1
    try:  # what the interpreter does on exit: wait for threads, then atexit handlers
        import atexit, threading
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


while True:
    header = requests.read(4)
    if len(header) < 4:
        break
    argv, env, cwd, timeout, out_path, err_path = pickle.loads(
        requests.read(struct.unpack("<I", header)[0])
    )
    pid = os.fork()
    if pid == 0:
        child(argv, env, cwd, out_path, err_path)
    deadline = time.monotonic() + timeout
    status = None
    while status is None:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(raw)
        elif time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = "timeout"
        else:
            time.sleep(0.01)
    reply = pickle.dumps(status)
    replies.write(struct.pack("<I", len(reply)) + reply)
    replies.flush()
"""

# The servers of this process, least recently used first. Each holds ~340 MB of memory of its
# own (torch's and JAX's modules, not shared with other processes); most calls use the suite's
# environment or the 8-device one, and the others (a test's own cache directory or log
# setting) come once: a server past the most recent ``_MAX_SERVERS`` is stopped, not kept
# idle until the worker exits (seven per worker over a run, on a machine without swap).
_servers: OrderedDict[tuple, subprocess.Popen] = OrderedDict()
_MAX_SERVERS = 3


def _server_key(env: Mapping[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if not k.startswith(_CHILD_ONLY)))


def _server(env: Mapping[str, str]) -> subprocess.Popen:
    key = _server_key(env)
    server = _servers.get(key)
    if server is None or server.poll() is not None:
        while len(_servers) >= _MAX_SERVERS:
            _stop(_servers.popitem(last=False)[1])
        server_env = {k: v for k, v in env.items() if not k.startswith(_CHILD_ONLY)}
        server = subprocess.Popen(
            [sys.executable, "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=server_env,
        )
        _servers[key] = server
    _servers.move_to_end(key)
    return server


def _stop(server: subprocess.Popen) -> None:
    """End an idle server: its loop ends when its requests do (it has no child running)."""
    if server.stdin is not None:
        server.stdin.close()
    server.wait(timeout=60)


@atexit.register
def _stop_servers() -> None:
    while _servers:
        _stop(_servers.popitem(last=False)[1])


_dirs: list[str] = []


def _private_dir() -> str:
    """This process's own folder for the children's output files (made once, removed at exit):
    a file of its own in the shared /tmp was seen deleted while its test still ran."""
    if not _dirs or not os.path.isdir(_dirs[0]):
        _dirs[:] = [tempfile.mkdtemp(prefix="torchlax-fresh-python-")]
        atexit.register(shutil.rmtree, _dirs[0], True)
    return _dirs[0]


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], capture_output=True, text=True, ...)`` in a
    child forked from a server that has imported torch and JAX: ``argv`` is ``["-c", code]``,
    ``["-m", module, *args]`` or ``[script, *args]``. Raises ``subprocess.TimeoutExpired`` as ``subprocess.run`` does."""
    env = dict(os.environ if env is None else env)
    server = _server(env)
    assert server.stdin is not None and server.stdout is not None
    with (
        tempfile.NamedTemporaryFile(prefix="out-", dir=_private_dir()) as out,
        tempfile.NamedTemporaryFile(prefix="err-", dir=_private_dir()) as err,
    ):
        request = pickle.dumps(
            (list(argv), env, None if cwd is None else str(cwd), timeout, out.name, err.name)
        )
        server.stdin.write(struct.pack("<I", len(request)) + request)
        server.stdin.flush()
        header = server.stdout.read(4)
        if len(header) < 4:
            raise RuntimeError(f"the fresh-process server exited ({server.wait()}); see stderr")
        status = pickle.loads(server.stdout.read(struct.unpack("<I", header)[0]))
        stdout = open(out.name, encoding="utf-8", errors="replace").read()
        stderr = open(err.name, encoding="utf-8", errors="replace").read()
    args = [sys.executable, *argv]
    if status == "timeout":
        raise subprocess.TimeoutExpired(args, timeout, stdout, stderr)
    return subprocess.CompletedProcess(args, status, stdout, stderr)
