"""Generation in a forked child (issue 45): a process that generated on several threads, then
forked, generates in the child, on its parent's Runtime or a fresh one, and gets the parent's
answer; under multiprocessing's fork and spawn start methods alike (docs/api.md, "Processes").
Each case runs in its own interpreter: the defect hung the child forever."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.hostile

WAIT = 600  # seconds: a bound that turns a hang into a failure on a loaded machine, never a timing

SCRIPT = textwrap.dedent("""
    import json, multiprocessing, os, sys
    import slm

    ROOT, EXACT, PROMPT = sys.argv[1], sys.argv[2] == "exact", "the cat sat on the mat and then it went out"
    CHILD_WAIT = 300

    def answer(runtime):
        return runtime.session("tq").generate(PROMPT, max_tokens=6).text

    def fresh():
        return answer(slm.Runtime(slm.Store.open(ROOT), threads=2, exact=EXACT))

    def report(queue, which):
        queue.put(parent_session_answer() if which == "same" else fresh())

    def parent_session_answer():
        return answer(RUNTIME)

    def by_multiprocessing(method, which):
        context = multiprocessing.get_context(method)
        queue = context.Queue()
        child = context.Process(target=report, args=(queue, which))
        child.start()
        text = queue.get(timeout=CHILD_WAIT)
        child.join(CHILD_WAIT)
        return text if child.exitcode == 0 else f"exit {child.exitcode}"

    def by_os_fork():
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, json.dumps([answer(RUNTIME), fresh()]).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            out = json.loads(f.read())
        os.waitpid(pid, 0)
        return out

    if __name__ == "__main__":
        RUNTIME = slm.Runtime(slm.Store.open(ROOT), threads=2, exact=EXACT)
        parent = answer(RUNTIME)  # the kernels' threads have started
        print(json.dumps({"parent": parent, "os.fork": by_os_fork(),
                          "fork": [by_multiprocessing("fork", "same"), by_multiprocessing("fork", "fresh")],
                          "spawn": by_multiprocessing("spawn", "fresh")}))
""")


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory, tiny_model):
    import slm

    store = slm.Store.init(tmp_path_factory.mktemp("fork") / "store")
    store.import_base(tiny_model["gguf_q"], "tq")
    return store.root


@pytest.mark.parametrize("mode", ["int8", "exact"])
def test_a_forked_child_generates_what_its_parent_does(tiny_root, tmp_path, mode):
    script = tmp_path / "fork_child.py"
    script.write_text(SCRIPT)
    # its own process group: a hung child of it is ended with it
    proc = subprocess.Popen([sys.executable, str(script), str(tiny_root), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"a forked child did not finish generating within {WAIT} s (hung)")
    assert proc.returncode == 0, stderr
    out = json.loads(stdout)
    parent = out["parent"]
    assert parent, out
    assert out["os.fork"] == [parent, parent], out
    assert out["fork"] == [parent, parent], out
    assert out["spawn"] == parent, out
