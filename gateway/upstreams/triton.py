"""Run the real `tritonserver` binary shipped in the nvidia-pytriton wheel on a generated repository.

Two pitfalls handled here: the Python-backend stub links a libpython that must resolve to this
interpreter's (LD_LIBRARY_PATH = its LIBDIR), and it finds `python3` on PATH to locate
site-packages (this venv's bin first; numpy<2 in it).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from pathlib import Path

from gateway.procs import Proc

_MODELS = Path(__file__).resolve().parent / "triton_models"

_TEXT_IO = """
input [ {{ name: "text_input" data_type: TYPE_STRING dims: [ -1 ] }} ]
output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""

# name -> (source file, versions, decoupled)
DEMO_MODELS: dict[str, tuple[str, tuple[int, ...], bool]] = {
    "echo": ("echo.py", (1, 2), False),
    "echo_stream": ("echo_stream.py", (1,), True),
}


def triton_home() -> Path:
    """The tritonserver directory inside the installed nvidia-pytriton wheel."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise RuntimeError("nvidia-pytriton is not installed (pip install 'ztgate[demo]')")
    return Path(spec.origin).parent / "tritonserver"


def write_repository(root: Path) -> Path:
    """Write the demo model repository (config.pbtxt + N/model.py per version)."""
    repo = root / "models"
    if repo.exists():
        shutil.rmtree(repo)
    for name, (src, versions, decoupled) in DEMO_MODELS.items():
        d = repo / name
        d.mkdir(parents=True)
        cfg = f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        cfg += _TEXT_IO.format(count=2 if decoupled else 1)
        if decoupled:
            cfg += "model_transaction_policy { decoupled: true }\n"
        cfg += "version_policy: { all { } }\n"
        (d / "config.pbtxt").write_text(cfg)
        for v in versions:
            (d / str(v)).mkdir()
            shutil.copy(_MODELS / src, d / str(v) / "model.py")
    return repo


def backend_dir(root: Path) -> Path:
    """A backend directory whose python/ holds the backend library, utils and this Python's stub."""
    home = triton_home()
    d = root / "backends" / "python"
    d.mkdir(parents=True, exist_ok=True)
    stub = home / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}"
    for f in (
        home / "backends/python/libtriton_python.so",
        home / "backends/python/triton_python_backend_utils.py",
        stub / "triton_python_backend_stub",
    ):
        dst = d / f.name
        if not dst.exists():
            shutil.copy2(f, dst)
    return d.parent


def process(root: Path, http_port: int, grpc_port: int, metrics_port: int, log: Path) -> Proc:
    """A Proc for tritonserver on loopback (not started)."""
    repo = write_repository(root)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    # The copied stub's RPATH ($ORIGIN/…) no longer reaches the wheel's bundled CUDA runtime.
    bundled = triton_home().parent.parent / "nvidia_pytriton.libs"
    env["LD_LIBRARY_PATH"] = f"{libdir}:{bundled}:{env.get('LD_LIBRARY_PATH', '')}"
    cmd = [
        str(triton_home() / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={backend_dir(root)}",
        "--http-address=127.0.0.1",
        f"--http-port={http_port}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={grpc_port}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={metrics_port}",
        "--allow-gpu-metrics=false",
        "--exit-timeout-secs=5",
        "--log-info=false",
    ]
    return Proc("triton", cmd, log, env=env)
