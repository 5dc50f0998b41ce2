"""A store many searches, processes and hosts use at once (store/__init__.py's contract), on SQLite and on a real
PostgreSQL (tests/pg.py): measurements never overwritten, leases (claims, one driver per search), the schema created
once under races, and two real searches at once plus a resume from another process, with nothing lost, duplicated
or overwritten and the database password in no file they write."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
import sqlalchemy as sa

from trainscout.store import Store, claims, default_url

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.timeout(900)


def rec(trial: str, tokens: float | None, status: str = "ok") -> dict:
    return {"model": "tiny", "status": status, "config": {"i": 1}, "trial_id": trial,
            "metrics": {"tokens_per_s": tokens, "step_s": 1.0} if tokens else None}


def test_a_second_measurement_of_a_key_is_a_sample_never_an_overwrite(url):
    from trainscout.analysis.table import load_resolved
    s = Store(url)
    assert s.add_measurement("k", rec("a", 204.0)) == "first"
    assert s.add_measurement("k", rec("b", 425.0)) == "sample"   # another search measured it again
    assert s.add_measurement("k", rec("b", 425.0)) == "duplicate"  # the same record written twice
    assert s.get("k").m["tokens_per_s"] == 204.0  # the first stays the key's measurement
    assert [(r.trial_id, r.m["tokens_per_s"]) for r in s.samples("k")] == [("a", 204.0), ("b", 425.0)]
    # a crash gives way to the next measurement, and is kept; a crash after an ok one is a sample
    assert s.add_measurement("c", rec("c1", None, "crash")) == "first"
    assert s.add_measurement("c", rec("c2", 461.0)) == "replaced"
    assert s.add_measurement("c", rec("c3", None, "crash")) == "sample"
    assert s.get("c").trial_id == "c2" and [r.trial_id for r in s.samples("c")] == ["c2", "c1", "c3"]
    assert s.add_measurement("c", rec("c4", 500.0)) == "sample"
    df = load_resolved(s).set_index("key")  # results shows how often a key was measured and the spread
    assert df.loc["k", "samples"] == 2 and df.loc["k", "tokens_per_s_spread"] == pytest.approx((425 - 204) / 204)
    assert df.loc["c", "samples"] == 4 and df.loc["c", "tokens_per_s"] == 461.0


def test_opening_a_store_to_read_it_adds_no_table(tmp_path):
    """bench/data holds tracked results.db files: a read (results, report) must leave them as they are."""
    url = default_url(str(tmp_path))
    Store(url).add_trial("s", "t", None, "invalid", False, 0.0, {})
    before = set(sa.inspect(sa.create_engine(url)).get_table_names())
    from trainscout.analysis.table import load_resolved
    load_resolved(Store(url))
    assert set(sa.inspect(sa.create_engine(url)).get_table_names()) == before
    assert "trainscout_samples" not in before and "trainscout_leases" not in before


def test_a_lease_is_refused_while_its_holder_lives_and_taken_when_it_dies(url):
    engine = Store(url).engine
    first = claims.Lease(engine, "search:s", {"search": "s"})
    first.try_acquire()
    with pytest.raises(claims.Held) as held:
        claims.Lease(engine, "search:s").try_acquire()
    assert held.value.holder["pid"] == os.getpid() and held.value.holder["host"] == claims.HOST
    with pytest.raises(Exception) as refused:  # the driver's refusal names the holder
        Store(url).hold_search("s")
    assert f"host {claims.HOST} pid {os.getpid()}" in str(refused.value)
    first.release()
    Store(url).hold_search("s").release()  # free again

    # a holder on another host that stops beating: refused until its lease expires, then taken over
    gone = claims.Lease(engine, "claim:k", {"host": "elsewhere", "pid": 1}, lease_s=1.5)
    gone.try_acquire()
    gone._stop.set()  # its heartbeat ends, as when its host is lost; its row stays
    with pytest.raises(claims.Held):
        claims.Lease(engine, "claim:k", lease_s=1.5).try_acquire()
    time.sleep(1.7)
    taker = claims.Lease(engine, "claim:k")
    taker.try_acquire()
    assert taker.taken_over["host"] == "elsewhere"
    gone.release()  # the dead holder's release frees nothing of its successor's
    with pytest.raises(claims.Held):
        claims.Lease(engine, "claim:k").try_acquire()
    taker.release()

    # a holder of this host killed by SIGKILL: its lease is taken at once (its pid is gone), not after LEASE_S
    script = textwrap.dedent("""
        import sys, time
        from trainscout.store import Store
        Store(sys.argv[1]).hold_search("killed")
        print("held", flush=True)
        time.sleep(600)
    """)
    p = subprocess.Popen([sys.executable, "-c", script, url], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stdout.readline().strip() == "held"
    with pytest.raises(Exception, match=f"pid {p.pid}"):
        Store(url).hold_search("killed")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    lease = Store(url).hold_search("killed")
    assert lease.taken_over["pid"] == p.pid
    lease.release()


def test_a_trial_waits_for_another_searchs_measurement_of_its_key_and_is_served_it(url, monkeypatch):
    monkeypatch.setattr(claims, "WAIT_POLL_S", 0.2)
    s = Store(url)
    first = s.claim("k", {"search": "a"})
    assert first.served is None  # nobody measures it: this trial does
    got = {}
    t = threading.Thread(target=lambda: got.update(claim=s.claim("k", {"search": "b"})))
    t.start()
    time.sleep(1.0)
    assert t.is_alive()  # the second search's trial waits
    s.add_measurement("k", rec("a1", 300.0))
    first.release()
    t.join(timeout=30)
    second = got["claim"]
    assert second.served.trial_id == "a1" and second.waited_s >= 1.0 and second.other["search"] == "a"
    assert second.lease is None and len(s.samples("k")) == 1  # served, not measured again
    # a crash does not stand for the configuration: the waiting trial then measures it itself
    s.add_measurement("c", rec("c1", None, "crash"))
    claim = s.claim("c", {"search": "b"})
    assert claim.served is None and claim.lease is not None
    claim.release()


OPENER = textwrap.dedent("""
    import os, sys, time
    from trainscout.store import Store, shared
    url, go, who = sys.argv[1], sys.argv[2], sys.argv[3]
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.01)
    store = Store(url)
    import optuna
    optuna.create_study(study_name=who, storage=shared.optuna_storage(url))
    store.add_search(who, {"who": who})
""")


def test_processes_opening_a_new_postgresql_store_at_once_create_its_schema_once(postgres, tmp_path):
    """Before the schema lock, 5 of 6 processes were refused and Optuna's CREATE TYPE studydirection raised
    UniqueViolation (2026-12-02)."""
    name = "race" + uuid.uuid4().hex[:8]
    postgres.create_database(name)
    url, go = postgres.url(name), tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", OPENER, url, str(go), f"s{i}"], cwd=ROOT, env=postgres.env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(6)]
    for p in procs:  # all imported (a fixed 2 s before)
        assert p.stdout.readline().strip() == "ready", p.stderr.read()[-2000:] if p.poll() is not None else ""
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    assert sorted(Store(postgres.url(name, password=True)).searches()) == [f"s{i}" for i in range(6)]


# --- two real searches at once on one cluster and a new PostgreSQL database, a resume from another process -------
FAST = ["--set", "compile=false", "--set", "loss_kernel=eager", "--set", "zero_stage=0", "--set", "tf32=true",
        "--set", "attention=sdpa", "--set", "micro_batch_size=2", "--set", "optimizer_state=fp32",
        "--set", "activation_offload=off", "--set", "optimizer_impl=auto"]  # this session's knobs: no invalid draws


def search(out, address, *extra) -> list[str]:
    return [sys.executable, "-m", "trainscout.cli", "search", "--model", "tiny", "--device", "cpu",
            "--gpus-per-trial", "2", "--steps", "2", "--warmup", "1", "--seed", "0", *FAST, "--address", address,
            "--out", str(out), *extra]


def rows(url: str) -> dict:
    """Every row of the store's trainscout tables, by table, as JSON-comparable values."""
    engine = sa.create_engine(url)
    out = {}
    with engine.connect() as c:
        for table in ("trainscout_measurements", "trainscout_search_trials", "trainscout_samples"):
            if not sa.inspect(c).has_table(table):  # samples: made by a key's first second measurement
                out[table] = []
                continue
            out[table] = [dict(r) for r in c.execute(sa.text(f"SELECT * FROM {table}")).mappings()]
    engine.dispose()
    return out


@pytest.fixture(scope="module")
def pg_searches(postgres, ray_cluster, tmp_path_factory):
    """Searches s-a (the password in its --storage URL; as many trials at once as the cluster has room for) and s-b
    (the password in its driver's PGPASSWORD alone: the cluster's processes have none; one at a time), started at
    once on the session's Ray cluster and a new PostgreSQL database, both from seed 0 (the same first draws); a
    second driver of s-a refused while it runs; then s-a resumed from another process, and a report of the store."""
    root = tmp_path_factory.mktemp("pg-searches")
    postgres.create_database("searches")
    bare, with_pw, addr = postgres.url("searches"), postgres.url("searches", password=True), ray_cluster["address"]
    env = dict(os.environ)
    env.pop("PGPASSWORD", None)
    t0 = time.time()
    a = subprocess.Popen(search(root / "s-a", addr, "--trials", "2", "--storage", with_pw), cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    b = subprocess.Popen(search(root / "s-b", addr, "--trials", "3", "--max-concurrent", "1", "--storage", bare),
                         cwd=ROOT, env=postgres.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # a driver of s-a on "another host" (another folder of that name, the same store) while s-a runs: refused
    deadline = time.time() + 120
    while time.time() < deadline and a.poll() is None:
        try:
            with sa.create_engine(with_pw).connect() as c:
                if c.execute(sa.text("SELECT 1 FROM trainscout_searches WHERE name = 's-a'")).first():  # its lease
                    break
        except sa.exc.SQLAlchemyError:  # the tables not made yet
            pass
        time.sleep(0.5)
    (root / "elsewhere" / "s-a").mkdir(parents=True)
    twin = subprocess.run([sys.executable, "-m", "trainscout.cli", "search", "--resume",
                           str(root / "elsewhere" / "s-a"), "--storage", bare, "--address", addr], cwd=ROOT,
                          env=postgres.env(), capture_output=True, text=True, timeout=300)
    outs = {"a": a.communicate(timeout=600), "b": b.communicate(timeout=600)}
    codes = {"a": a.returncode, "b": b.returncode}
    together_s = time.time() - t0
    before = rows(with_pw)
    t1 = time.time()  # the resume: another process, the password from PGPASSWORD
    res = subprocess.run([sys.executable, "-m", "trainscout.cli", "search", "--resume", str(root / "s-a"), "--trials",
                          "3", "--storage", bare, "--address", addr], cwd=ROOT, env=postgres.env(),
                         capture_output=True, text=True, timeout=600)
    resume_s = time.time() - t1
    from trainscout.analysis.report import report
    report(with_pw, str(root / "report"))
    yield {"root": root, "session_dir": ray_cluster["session_dir"], "url": with_pw, "outs": outs, "codes": codes,
           "twin": twin, "before": before, "after": rows(with_pw), "resume": res, "password": postgres.password,
           "seconds": {"two searches": round(together_s, 1), "resume": round(resume_s, 1)}}


def test_two_searches_at_once_on_one_cluster_and_a_new_postgresql_database(pg_searches):
    """Before: one of two searches started together on a new database died with UniqueViolation (Optuna's CREATE
    TYPE studydirection), and two searches on one database measured the same configurations at the same time, the
    second's records overwriting the first's (2026-12-02)."""
    r = pg_searches
    for who in ("a", "b"):
        assert r["codes"][who] == 0, r["outs"][who][1][-3000:]
        assert "UniqueViolation" not in r["outs"][who][1]
    # each search's start line (the header: after the line that says it is attaching)
    start_a, start_b = (next(ln for ln in r["outs"][who][0].splitlines() if " at once (" in ln) for who in "ab")
    assert "on 2 nodes" in start_a and "at once (what the cluster has free now" in start_a, start_a
    assert "1 at once (--max-concurrent)" in start_b, start_b
    first = r["outs"]["a"][0].splitlines()[0]  # said before Ray is reached: a search's first seconds are not silent
    assert first.startswith("search s-a: attaching to 127.0.0.1:") and "first worker group" in first, first
    got = r["before"]
    trials = got["trainscout_search_trials"]
    assert sorted(t["search"] for t in trials) == ["s-a"] * 2 + ["s-b"] * 3
    measured = {m["key"]: m for m in got["trainscout_measurements"]}
    for search in ("s-a", "s-b"):  # both measured on the cluster
        assert [t for t in trials if t["search"] == search and t["status"] == "ok" and not t["cached"]], trials
    for m in measured.values():  # hardware read on the cluster's CPU nodes; each trial packed on one of them
        rec = json.loads(m["record"])
        assert rec["hardware"]["nodes"] == 2 and rec["placement"] == {"nodes": 1, "ranks_per_node": [2],
                                                                      "split": False}
    # the same first draws: the configuration was measured by one search; the other waited and was served it
    shared = {t["key"] for t in trials if t["search"] == "s-a"} & {t["key"] for t in trials if t["search"] == "s-b"}
    shared.discard(None)
    assert shared, trials
    for key in shared:  # (served after a wait, "measured by another search", when both ran it at the same time)
        ran = [t for t in trials if t["key"] == key and not t["cached"]]
        assert len(ran) == 1, [t for t in trials if t["key"] == key]
    print(r["outs"]["a"][0], r["outs"]["b"][0])
    assert not got["trainscout_samples"]  # no configuration was measured twice
    for t in trials:  # every ok row's value is its key's stored measurement: nothing overwritten
        if t["status"] == "ok":
            assert measured[t["key"]]["tokens_per_s"] == t["tokens_per_s"]
    # one driver per search: the second was refused, naming the first (host, pid), with nothing written
    assert r["twin"].returncode == 2 and "is being run by host" in r["twin"].stderr, r["twin"].stderr[-2000:]
    assert "pid" in r["twin"].stderr and "Traceback" not in r["twin"].stderr
    print("seconds:", r["seconds"])


def test_a_resume_from_another_process_keeps_every_row(pg_searches):
    r = pg_searches
    assert r["resume"].returncode == 0, r["resume"].stderr[-3000:]
    before, after = r["before"], r["after"]
    for table in ("trainscout_measurements", "trainscout_search_trials", "trainscout_samples"):
        for row in before[table]:  # nothing lost or changed
            assert row in after[table], (table, row)
    trials = after["trainscout_search_trials"]
    assert len([t for t in trials if t["search"] == "s-a"]) == 3
    assert len({(t["search"], t["trial"]) for t in trials}) == len(trials)  # nothing duplicated
    assert len({m["key"] for m in after["trainscout_measurements"]}) == len(after["trainscout_measurements"])
    import optuna
    study = optuna.load_study(study_name="s-a", storage=r["url"])
    assert len(study.trials) >= 3 and not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]


def test_the_database_password_is_in_no_file_a_search_or_report_writes(pg_searches):
    """Before: the password was in report.html (twice), the start line, the stored settings and Tune's files."""
    r = pg_searches
    secret = r["password"].encode()
    html = (r["root"] / "report" / "report.html").read_text()
    assert "searches" in html and "***" in html  # the store's URL is shown, its password masked
    checked, leaks = 0, []
    for top in (r["root"], r["session_dir"]):  # the search folders (Tune's files), the report, the cluster's logs
        for d, _, files in os.walk(top):
            for f in files:
                path = os.path.join(d, f)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                checked += 1
                with open(path, "rb") as fh:
                    if secret in fh.read():
                        leaks.append(path)
    tune = [f for d, _, fs in os.walk(r["root"] / "s-a" / "tune") for f in fs]
    assert "params.json" in tune and any(f.startswith("experiment_state") for f in tune), tune
    assert checked > 50 and not leaks, leaks
    for out, err in [*r["outs"].values(), (r["resume"].stdout, r["resume"].stderr)]:
        assert r["password"] not in out + err  # nor the live output, the start line, the logs printed
    with sa.create_engine(r["url"]).connect() as c:  # nor the store: the saved settings, the study
        for table in ("trainscout_searches", "studies", "study_user_attributes", "trial_user_attributes"):
            text = json.dumps([list(map(str, row)) for row in c.execute(sa.text(f"SELECT * FROM {table}"))])
            assert r["password"] not in text, table


def test_passwords_published_by_two_searches_in_one_process_stay_reachable(ray_local, monkeypatch):
    """run_search twice in one process (the suite's in-process searches): the second publish replaced the handle
    that owned the secrets actor, which ended it, and its put failed with ActorDiedError (2026-12-04)."""
    import ray

    from trainscout.store import secrets
    ident = ("scout", "db.example", 5433, "runs")
    monkeypatch.setitem(secrets.PASSWORDS, ident, "first")
    secrets.publish()
    monkeypatch.setitem(secrets.PASSWORDS, ident, "second")
    secrets.publish()
    assert ray.get(ray.get_actor(secrets.ACTOR).get.remote(ident), timeout=60) == "second"


def test_the_password_for_a_trial_on_another_host_comes_from_where_libpq_reads_it(tmp_path, monkeypatch):
    """The driver forwards the password libpq would use (PGPASSWORD, else ~/.pgpass) to its trials' processes."""
    from trainscout.store import secrets
    u = sa.engine.make_url("postgresql+psycopg://scout@db.example:5433/runs")
    monkeypatch.delenv("PGPASSWORD", raising=False)
    passfile = tmp_path / "pgpass"
    passfile.write_text("# comment\nother:5433:runs:scout:no\ndb.example:*:runs:scout:s3cr\\:et\n")
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    assert secrets.password_from_libpq(u) == "s3cr:et"
    monkeypatch.setenv("PGPASSWORD", "from-env")
    assert secrets.password_from_libpq(u) == "from-env"
    bare = secrets.strip("postgresql+psycopg://scout:hunter2@db.example:5433/runs")
    assert bare == "postgresql+psycopg://scout@db.example:5433/runs" and "hunter2" not in secrets.masked(bare)
    assert secrets.masked("postgresql://scout:hunter2@h/db") == "postgresql://scout:***@h/db"
