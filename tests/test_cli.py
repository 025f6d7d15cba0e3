"""The carpool command, run as a user runs it: a real subprocess."""

import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "carpool", *args], capture_output=True, text=True, timeout=120
    )


def test_demo_batches_and_checks_every_row() -> None:
    done = run("demo", "--requests", "300", "--concurrency", "32", "--max-batch-size", "16")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "300 requests, 32 concurrent callers" in out
    assert "every caller got its own row (same as running it alone): True" in out
    assert "completed=300 failed=0 expired=0 cancelled=0" in out
    assert "max_batch_size=16" in out


def test_help_explains_the_commands() -> None:
    done = run("--help")
    assert done.returncode == 0
    assert "demo" in done.stdout
    demo = run("demo", "--help")
    assert "CARPOOL_REQUESTS" in demo.stdout


def test_unknown_command_is_a_usage_error() -> None:
    done = run("fly")
    assert done.returncode == 2
    assert "invalid choice: 'fly'" in done.stderr
