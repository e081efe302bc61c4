"""Ctrl-C while the `judge` console script is still importing ends with exit 130 and no
traceback: the script's own import (`from runner.cli import judge`) loads almost nothing, and
`runner.cli.judge` catches the interrupt while the commands load."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.test_cli import JUDGE, SUBPROCESS_TIMEOUT_S

# Runs the installed console script as the shell does, with a Ctrl-C arriving exactly when the
# module TARGET is first imported (an import hook raises it, as Python's SIGINT handler would
# at that moment): a deterministic stand-in for a Ctrl-C in the first ~0.1 s.
INTERRUPTED = """
import sys
target, script = sys.argv[1], sys.argv[2]
if target in sys.modules:
    print("already imported at start-up:", target)
    sys.exit(3)

class CtrlC:
    def find_spec(self, name, path=None, target_=None):
        if name == target:
            sys.meta_path.remove(self)
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = [script, "--help"]
with open(script) as f:
    code = compile(f.read(), script, "exec")
exec(code, {"__name__": "__main__"})
"""


@pytest.mark.slow
@pytest.mark.parametrize("target", ["signal", "typing", "runner.errors", "click", "runner.cli.main",
                                    "runner.session"])
def test_ctrl_c_while_the_console_script_imports_exits_130_without_a_traceback(
        target: str) -> None:
    done = subprocess.run([sys.executable, "-c", INTERRUPTED, target, JUDGE],
                          capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S,
                          check=False)

    if done.returncode == 3:
        pytest.skip(done.stdout.strip())
    assert "Traceback" not in done.stderr, done.stderr
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "")
