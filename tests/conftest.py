import os

import pytest

# Compiled extensions (DeepSpeed ops, inductor kernels) are cached inside the checkout, ignored by git.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(_ROOT, ".cache", "torch_extensions"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_ROOT, ".cache", "inductor"))
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


_prewarm = {}  # the background compile of tests/prewarm.py: {"proc", "log"}


def _start_prewarm(session):
    """Start tests/prewarm.py in the background (nice 19, one thread) when this session runs a test whose graphs it
    compiles after at least 50 others (their idle CPU is its time), unless its marker says the cache has them
    already. TRAINSCOUT_TEST_PREWARM=0 leaves it out."""
    import subprocess
    import sys

    import prewarm
    ids = [item.nodeid for item in session.items]
    first = next((i for i, n in enumerate(ids) if n.startswith(prewarm.TARGETS)), None)
    if os.environ.get("TRAINSCOUT_TEST_PREWARM") == "0" or first is None or first < 50:
        return
    try:
        with open(prewarm.marker()) as f:
            if f.read().strip() == prewarm.fingerprint():
                return
    except OSError:
        pass
    os.makedirs(os.path.dirname(prewarm.marker()), exist_ok=True)
    log = os.path.join(os.path.dirname(prewarm.marker()), "prewarm.log")
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1", OMP_NUM_THREADS="1")
    with open(log, "w") as out:
        _prewarm.update(log=log, proc=subprocess.Popen(
            ["nice", "-n", "19", sys.executable, os.path.join(_ROOT, "tests", "prewarm.py")], stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=_ROOT, env=env))


def pytest_terminal_summary(terminalreporter):
    """Say where the background compile did not finish its work (the tests then compiled their own graphs)."""
    proc = _prewarm.get("proc")
    if proc is None:
        return
    rc = proc.poll()
    if rc is None:
        proc.kill()  # the session's own child, by its PID
        proc.wait()
        terminalreporter.write_line("tests/prewarm.py was still compiling at the session's end: stopped")
    elif rc != 0:
        terminalreporter.write_line(f"tests/prewarm.py exited {rc} (the tests compiled their own graphs): see "
                                    f"{_prewarm['log']}")


def pytest_configure(config):
    """torch in the test process itself runs on one thread (its ops there are tiny models' and meta traces'). With
    two on 2 cores beside Ray's processes, the threads waited on each other: tests/test_hub_corpus.py took 35 s
    instead of 17 s, the qwen3-30b-a3b FLOP count 15 s instead of 0.4 s. Subprocesses and the ranks keep their own
    setting (trial/worker.py sets the ranks')."""
    import torch
    torch.set_num_threads(1)
# the registry of running trials (trial.contention): this session's own, so that trials of other test sessions on the
# box do not mark its measurements shared (and unserved); its own trials still see each other
os.environ.setdefault("TRAINSCOUT_RUNNING_DIR", os.path.join("/tmp", f"trainscout-running-tests-{os.getpid()}"))


def ray_worker_pids() -> list[int]:
    """PIDs of rank processes (trial.pool) still alive (used to prove none outlives a failed trial)."""
    import psutil
    out = []
    for p in psutil.process_iter(["name", "cmdline"]):
        name = p.info["name"] or ""
        cmd = " ".join(p.info["cmdline"] or [])
        if "ray::Rank" in name or "ray::Rank" in cmd:
            out.append(p.pid)
    return out


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole session (as the CLI starts it: 127.0.0.1, no dashboard)."""
    import ray

    from trainscout.trial.ray_cluster import ensure_ray
    ensure_ray()
    yield ray
    ray.shutdown()


@pytest.fixture
def h200_grid(tmp_path):
    """A copy of bench/data/grid-h200 (64 real H200 measurements): a test reads the copy, so nothing it opens can
    change the tracked store (opening one for writing adds tables)."""
    import shutil
    d = tmp_path / "grid-h200"
    d.mkdir()
    shutil.copy(os.path.join(_ROOT, "bench", "data", "grid-h200", "results.db"), d / "results.db")
    return str(d)


@pytest.fixture(scope="session")
def quality_tokens(tmp_path_factory):
    """verify --quality's corpus as token ids for the tests' tiny model (analysis.quality.corpus_tokens: a tokenizer
    of its vocabulary trained on the shipped text, then the text encoded), made once for the session: put(folder)
    copies the file into a folder, where a verify into that folder finds it (it makes it once per folder)."""
    import shutil

    from trainscout.analysis.quality import corpus_tokens
    from trainscout.trial.models import resolve_model, sizes
    path, _ = corpus_tokens(str(tmp_path_factory.mktemp("quality-tokens")), sizes(resolve_model("tiny").config).vocab)

    def put(folder) -> None:
        os.makedirs(folder, exist_ok=True)
        shutil.copy(path, os.path.join(folder, os.path.basename(path)))
    return put


@pytest.fixture
def worker_pids():
    return ray_worker_pids


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    """A new store: a SQLite file, or a new database on the session's PostgreSQL (its password in the URL)."""
    import uuid

    from trainscout.store import default_url
    if request.param == "sqlite":
        return default_url(str(tmp_path))
    pg = request.getfixturevalue("postgres")
    name = "t" + uuid.uuid4().hex[:12]
    pg.create_database(name)
    return pg.url(name, password=True)


@pytest.fixture(scope="session")
def example_plugin(tmp_path_factory) -> str:
    """examples/knob-plugin as an installed distribution in a folder of its own: its module and a dist-info with the
    name, version and entry points of its pyproject.toml, as an install writes them (importlib.metadata finds it on
    sys.path). The commands that load it get the folder on PYTHONPATH; nothing is pip-installed and the suite's own
    environment is never changed."""
    import shutil
    import tomllib
    src = os.path.join(_ROOT, "examples", "knob-plugin")
    with open(os.path.join(src, "pyproject.toml"), "rb") as f:
        meta = tomllib.load(f)
    project = meta["project"]
    folder = tmp_path_factory.mktemp("example-plugin")
    for module in meta["tool"]["setuptools"]["py-modules"]:
        shutil.copy(os.path.join(src, f"{module}.py"), folder / f"{module}.py")
    info = folder / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in eps.items())
        for group, eps in project["entry-points"].items()))
    return str(folder)


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server on 127.0.0.1 for the session (tests/pg.py), stopped by its own pg_ctl. Missing
    PostgreSQL or psycopg fails the tests that need it, with how to install it; TRAINSCOUT_PG_OPTIONAL=1 makes that
    a skip with the reason (locally only: .ci/run installs both and never sets it)."""
    import pg
    why = pg.missing()
    if why:
        if os.environ.get(pg.OPTIONAL_ENV) == "1":
            pytest.skip(f"{why} ({pg.OPTIONAL_ENV}=1)")
        pytest.fail(f"{why} (or {pg.OPTIONAL_ENV}=1 to skip the PostgreSQL tests on a box without it)", pytrace=False)
    server = pg.Server()
    try:
        yield server.start()
    finally:
        server.stop()


_cluster = {}  # the session's Ray cluster (tests/raycluster.py): {"proc", "last" (the nodeid of its last user)}


@pytest.fixture(scope="session")
def ray_cluster():
    """A real multi-node Ray cluster on 127.0.0.1 for the session, in a process of its own (tests/raycluster.py:
    a head without CPUs, two CPU nodes, a node with a mock of a GPU): {"address", "head", "cpu_nodes", "gpu_node",
    "send"(command) -> its answer}. Ended by closing that process's stdin (its cluster's own shutdown), after the
    session's last test that asks for it (pytest_runtest_teardown), or at the session's end."""
    import json
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, os.path.join(_ROOT, "tests", "raycluster.py")], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, cwd=_ROOT)
    try:
        info = json.loads(p.stdout.readline())
    except ValueError:
        p.kill()
        raise RuntimeError("tests/raycluster.py did not start its cluster (its stderr is above)") from None

    def send(command: str) -> str:
        p.stdin.write(command + "\n")
        p.stdin.flush()
        return p.stdout.readline().strip()
    info["send"] = send
    _cluster["proc"] = p
    return info


def _stop_cluster() -> None:
    import subprocess
    p = _cluster.pop("proc", None)
    if p is None:
        return
    p.stdin.close()
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.terminate()  # the helper's SIGTERM handler shuts its cluster down
        p.wait(timeout=60)


def pytest_collection_modifyitems(session, config, items):
    """The files whose tests ask for the Ray cluster run one after another, from where the first of them is in the
    suite's order (each file's tests in their order): the cluster is shut down after the last of them, not left idle
    beside every later test (pytest_runtest_teardown)."""
    files = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    users = [f for f, its in files.items() if any("ray_cluster" in it.fixturenames for it in its)]
    if len(users) < 2:
        return
    order = []
    for f in files:
        if f in users:
            if f == users[0]:
                order += users
        else:
            order.append(f)
    items[:] = [it for f in order for it in files[f]]


def pytest_collection_finish(session):
    users = [item.nodeid for item in session.items if "ray_cluster" in item.fixturenames]
    _cluster["last"] = users[-1] if users else None
    _start_prewarm(session)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # the item's teardown first: module fixtures built on the cluster end with its file
    if item.nodeid == _cluster.get("last"):
        _stop_cluster()


def pytest_unconfigure(config):
    _stop_cluster()
    proc = _prewarm.get("proc")
    if proc is not None and proc.poll() is None:  # an interrupted session: its own child, by its PID
        proc.kill()
        proc.wait()
