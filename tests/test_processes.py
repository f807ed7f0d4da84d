"""The forkserver that GPU workers and compile processes start from (evotune.measurement.processes).

Each case runs in a fresh interpreter: the server is started once per process, by the first caller.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

SCRIPT = textwrap.dedent('''
    import json, os, signal, sys, time
    from concurrent.futures import ProcessPoolExecutor

    from evotune.measurement.isolation import WorkerProcess, answer_requests
    from evotune.measurement.messages import DeviceInfo, Evaluate, Reply, ReplyStatus
    from evotune.measurement.processes import INHERITED_CUDA, pool_initializer, start_method

    PRELOADED = "xml.dom.minidom"

    class Handler:
        def handle(self, request):
            if isinstance(request, DeviceInfo):
                time.sleep(0.05)  # the worker's own time on the request, which its reply reports
                return Reply(ReplyStatus.OK, info={"value": os.environ.get("EVOTUNE_TEST_VALUE"),
                                                   "preloaded": PRELOADED in sys.modules, "pid": os.getpid(),
                                                   "warmed": getattr(sys.modules.get("warmed_at_start"), "CALLS", None),
                                                   "cpus": sorted(os.sched_getaffinity(0))})
            os.kill(os.getpid(), signal.SIGSEGV)

    def flat(reply):
        return {"status": reply.status.value, "message": reply.message, "served_s": reply.served_s, **reply.info}

    def main(conn):
        answer_requests(conn, Handler)

    class Refusing(Handler):
        def __init__(self):  # as the GPU worker does when it finds CUDA initialised before its own first call
            if PRELOADED in sys.modules:
                raise RuntimeError(INHERITED_CUDA)

    def refusing_main(conn):
        answer_requests(conn, Refusing)

    def in_pool():
        return os.environ.get("EVOTUNE_TEST_VALUE"), PRELOADED in sys.modules

    if __name__ == "__main__":
        sys.path.insert(0, sys.argv[1])  # where raises_on_import.py lives
        os.environ["EVOTUNE_TEST_VALUE"] = "at the server's start"
        ctx = start_method(("raises_on_import", "no_such_module_anywhere", PRELOADED, "warmed_at_start:warm",
                            f"{PRELOADED}:no_such_function"))
        out = {"method": ctx.get_start_method(), "parent_has_it": PRELOADED in sys.modules}
        os.environ["EVOTUNE_TEST_VALUE"] = "later"  # a child takes its parent's environment of its own start
        worker = WorkerProcess(main, (), "test worker", 600, start=ctx)
        worker.call(DeviceInfo())  # started and answering: the next call's wait is the request's alone
        began = time.perf_counter()
        out["first"] = flat(worker.call(DeviceInfo()))
        out["first"]["waited_s"] = time.perf_counter() - began
        out["crash"] = flat(worker.call(Evaluate({}, {}, seed=1)))
        out["after_crash"] = flat(worker.call(DeviceInfo()))
        worker.close()
        refusing = WorkerProcess(refusing_main, (), "test worker", 600, start=ctx)
        out["refused"] = flat(refusing.call(DeviceInfo()))
        out["refused"]["restarts"] = refusing.restarts
        refusing.close()
        with ProcessPoolExecutor(1, mp_context=ctx, initializer=pool_initializer,
                                 initargs=(dict(os.environ),)) as pool:
            out["pool"] = pool.submit(in_pool).result()
        # the server started on every CPU; a worker started while its parent runs on one runs there too
        everywhere = os.sched_getaffinity(0)
        out["cpus"] = sorted(everywhere)
        os.sched_setaffinity(0, {max(everywhere)})
        placed = WorkerProcess(main, (), "test worker", 600, start=ctx)
        out["placed"] = flat(placed.call(DeviceInfo()))
        placed.close()
        os.sched_setaffinity(0, everywhere)
        print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> dict:
    """What the script saw: one fresh interpreter for every case below."""
    tmp_path = tmp_path_factory.mktemp("forkserver")
    script = tmp_path / "forkserver_case.py"
    script.write_text(SCRIPT)
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('this module cannot be imported')\n")
    (tmp_path / "warmed_at_start.py").write_text("import os\nCALLS = []\ndef warm():\n    CALLS.append(os.getpid())\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_children_fork_from_a_server_that_imported_the_preload_and_survives_a_bad_module(out):
    assert out["method"] == "forkserver"
    # the module came from the server's imports, not from the parent or the child's own start
    assert out["parent_has_it"] is False
    assert out["first"]["status"] == "ok" and out["first"]["preloaded"] is True
    # a child runs with its parent's environment as it was when the child started, not the server's
    assert out["first"]["value"] == "later"
    assert out["pool"] == ["later", True]
    # MODULE:FUNCTION: called once, in the server (a cache every child inherits); a missing function is passed over
    assert len(out["first"]["warmed"]) == 1 and out["first"]["warmed"][0] != out["first"]["pid"]


def test_a_child_runs_on_the_cpus_of_the_process_that_starts_it_not_the_servers(out):
    assert out["first"]["cpus"] == out["cpus"]  # started while its parent ran on every CPU
    assert out["placed"]["status"] == "ok" and out["placed"]["preloaded"] is True
    assert out["placed"]["cpus"] == [max(out["cpus"])]  # the server still runs on every CPU


def test_a_reply_says_the_workers_own_time_on_the_request(out):
    """What the parent waited less the worker's own time is the pipe's and the parent's delays (a trial's
    ``worker_s`` less its ``served_s``)."""
    assert 0.05 <= out["first"]["served_s"] <= out["first"]["waited_s"]


def test_a_crashed_child_is_reported_and_the_next_one_forks_from_the_same_server(out):
    assert out["crash"]["status"] == "crash" and "signal 11" in out["crash"]["message"]
    assert out["after_crash"]["status"] == "ok" and out["after_crash"]["preloaded"] is True
    assert out["after_crash"]["pid"] != out["first"]["pid"]


def test_a_child_that_inherited_cuda_is_started_again_with_spawn(out):
    refused = out["refused"]
    # the second start was a clean interpreter: nothing preloaded, and it is not counted as a replacement
    assert refused["status"] == "ok" and refused["preloaded"] is False and refused["value"] == "later"
    assert refused["restarts"] == 0


def gpu_experiment(tmp_path):
    """A small GPU experiment's file, with its sqlite storage beside it (``s.db``, not created)."""
    path = tmp_path / "exp.toml"
    path.write_text('space = "triton_matmul"\nhardware = "auto"\n[oracle]\nkind = "gpu"\n[[problem]]\nm = 64\n'
                    'n = 64\nk = 64\ndtype = "bf16"\n[strategy]\nname = "random"\n[budget]\ntrials = 4\n'
                    f'[storage]\nurl = "sqlite:///{tmp_path / "s.db"}"\n')
    return path


@pytest.mark.parametrize("gpus", [1, 0])
def test_a_gpu_run_starts_its_measuring_processes_before_it_reads_the_gpu(tmp_path, monkeypatch, gpus):
    """Their imports (torch, the spaces' compilers) take seconds; reading the GPU's limits and opening the storage
    take seconds too: on a host with a GPU they overlap. On a host without one the experiment is refused while
    resolving, and nothing has started."""
    pytest.importorskip("torch")
    from evotune.measurement import gpu, host
    from evotune.running import session
    from evotune.running.experiment import load_experiment

    path = gpu_experiment(tmp_path)
    happened: list[str] = []
    monkeypatch.setattr(host, "host_gpus", lambda: gpus)
    monkeypatch.setattr(gpu, "start_processes", lambda spaces: happened.append(
        "measuring processes started: " + ",".join(s.name for s in spaces)))

    def resolve_targets(exp, measuring=True):
        happened.append("targets resolved")
        raise RuntimeError("stop here")

    monkeypatch.setattr(session, "resolve_targets", resolve_targets)
    exp = load_experiment(path)
    with pytest.raises(RuntimeError, match="stop here"):
        session.Session(exp, session.StudyStorage.tuning(exp))
    assert happened == (["measuring processes started: triton_matmul"] if gpus else []) + ["targets resolved"]
    assert not (tmp_path / "s.db").exists()


def test_a_gpu_run_places_its_process_and_puts_it_back_when_it_ends(tmp_path, monkeypatch):
    """The tuner measures on a core of its own for the run (evotune.measurement.host), placed once the server its
    GPU workers fork from has started on every core (its imports then run beside the tuner's start-up); a run
    that ends, here refused while resolving, leaves it where it was."""
    pytest.importorskip("torch")
    from evotune.measurement import gpu, host
    from evotune.running import session
    from evotune.running.experiment import load_experiment

    path = gpu_experiment(tmp_path)
    happened: list[str] = []
    monkeypatch.setattr(host, "host_gpus", lambda: 1)
    monkeypatch.setattr(host, "place_measuring", lambda: happened.append("placed"))
    monkeypatch.setattr(session, "unplace", lambda: happened.append("put back"))
    monkeypatch.setattr(gpu, "start_processes", lambda spaces: happened.append("server started"))

    def resolve_targets(exp, measuring=True):
        raise RuntimeError("stop here")

    monkeypatch.setattr(session, "resolve_targets", resolve_targets)
    exp = load_experiment(path)
    with pytest.raises(RuntimeError, match="stop here"):
        session.Session(exp, session.StudyStorage.tuning(exp))
    assert happened == ["server started", "placed", "put back"]


def test_a_child_that_cannot_take_its_parents_cpus_runs_where_it_is():
    from evotune.measurement.processes import Inherited, as_child

    before = os.sched_getaffinity(0)
    gone = Inherited(dict(os.environ), frozenset({(os.cpu_count() or 1) + 4096}))  # no such CPU here
    assert as_child(gone, lambda x: x + 1, 1) == 2
    assert os.sched_getaffinity(0) == before
