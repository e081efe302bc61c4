"""tools/buildprogress.py: the line `make install-local` prints every minute while pip builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import buildprogress

PIP_START = """\
Using pip 25.3 from /work/.venv/lib/python3.11/site-packages/pip (python 3.11)
Collecting llama-cpp-python>=0.3
  Downloading llama_cpp_python-0.3.36.tar.gz (76.6 MB)
  Running command pip subprocess to install build dependencies
"""
# what `pip install -v` logs of scikit-build-core's CMake + ninja build
NINJA = """\
  *** Configuring CMake...
  -- The C compiler identification is GNU 12.2.0
  *** Building project with Ninja...
  [1/193] Building C object vendor/llama.cpp/ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o
  [89/193] Building CXX object vendor/llama.cpp/src/CMakeFiles/llama.dir/llama-model.cpp.o
  [90/193] Building CXX object vendor/llama.cpp/src/CMakeFiles/llama.dir/llama-vocab.cpp.o
  /tmp/pip-install-x/vendor/llama.cpp/src/llama-vocab.cpp:12:5: warning: unused [-Wunused]
"""


def test_the_line_is_the_builds_last_step_and_the_minutes() -> None:
    assert buildprogress.progress_line(PIP_START + NINJA, 725) == \
        "llama.cpp: 90/193 steps, 12 min"


def test_before_the_compiler_the_line_is_pips_last_line() -> None:
    assert buildprogress.progress_line(PIP_START, 60) == \
        "1 min: Running command pip subprocess to install build dependencies"
    assert buildprogress.progress_line("", 0) == "0 min: starting pip"


def test_a_make_build_reports_its_percentage() -> None:
    log = PIP_START + "  [  4%] Building C object ggml.c.o\n  [ 45%] Linking CXX library\n"
    assert buildprogress.progress_line(log, 300) == "llama.cpp: 45% built, 5 min"


def test_the_script_reads_the_end_of_a_large_log(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "install-local.log"
    steps = "".join(f"  [{n}/193] Building CXX object o{n}.o\n" for n in range(1, 194))
    log.write_text(PIP_START + "  noise\n" * 20_000 + steps + "  Successfully built\n")
    assert buildprogress.main([str(log), "1200"]) == 0
    assert capsys.readouterr().out == "llama.cpp: 193/193 steps, 20 min\n"
    assert buildprogress.main([str(tmp_path / "not-yet.log"), "60"]) == 0
    assert capsys.readouterr().out == "1 min: starting pip\n"
