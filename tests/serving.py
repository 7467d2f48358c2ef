"""Start and stop the real ``gpu-admission serve`` (a subprocess) for tests and benchmarks.

Everything here is bounded: every wait has a deadline, every connection a timeout, and a
server that does not stop on SIGTERM is killed with its process group.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.support.paths import REPO
from webhook.certs import pki

FIXTURES = Path(__file__).resolve().parent / "fixtures"

# A policy whose outcomes the tests rely on: one pool whose taint GPU Pods get a toleration
# for, privileged containers only warned about, GPU device host paths only audited.
TEST_POLICY = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUAdmissionPolicy
metadata:
  name: server-tests
spec:
  pools:
    - name: a100
      nodeSelector:
        nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB
      resources:
        - name: nvidia.com/gpu
          sharing: Exclusive
      taints:
        - key: nvidia.com/gpu
          value: present
          effect: NoSchedule
  rules:
    privileged:
      gpuPods: Warn
    host-devices:
      gpuPods: Audit
"""

# The same policy with privileged containers denied: a visible change for reload tests.
STRICT_POLICY = TEST_POLICY.replace("gpuPods: Warn", "gpuPods: Enforce")

# Valid YAML, refused by the schema.
INVALID_POLICY = TEST_POLICY.replace("  rules:", "  bogusField: 1\n  rules:")

SERVICE = "gpu-admission"
NAMESPACE = "gpu-admission"
HOSTS = ("127.0.0.1", "localhost")


def _terminate_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, so none is left behind
    by an interrupted run (Linux's PR_SET_PDEATHSIG; elsewhere nothing)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def load_fixture(name: str) -> dict[str, Any]:
    return json.loads(fixture_bytes(name))


def make_certificates(
    out_dir: Path, *, ca: pki.GeneratedCertificates | None = None
) -> pki.GeneratedCertificates:
    """A serving certificate for 127.0.0.1 and localhost; signed by ``ca``'s CA if given."""
    return pki.generate(
        out_dir,
        service=SERVICE,
        namespace=NAMESPACE,
        hosts=list(HOSTS),
        ca_cert_path=ca.ca_cert if ca is not None else None,
        ca_key_path=ca.ca_key if ca is not None else None,
    )


class MountedDir:
    """A directory laid out like a ConfigMap or Secret volume, updated the same way.

    Files live in a timestamped directory, ``..data`` links to it and each name links to
    ``..data/name``. An update writes a new timestamped directory and renames a new link over
    ``..data``: the paths stay the same while what they resolve to changes in one step.
    """

    def __init__(self, root: Path, files: Mapping[str, bytes]) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._generation = 0
        self.update(files)
        for name in files:
            (self.root / name).symlink_to(Path("..data") / name)

    def path(self, name: str) -> Path:
        return self.root / name

    def update(self, files: Mapping[str, bytes]) -> None:
        self._generation += 1
        version = self.root / f"..{self._generation:04d}"
        version.mkdir()
        for name, content in files.items():
            (version / name).write_bytes(content)
        link = self.root / "..data_tmp"
        link.symlink_to(version.name)
        previous = (self.root / "..data").resolve() if (self.root / "..data").exists() else None
        os.replace(link, self.root / "..data")
        if previous is not None:
            shutil.rmtree(previous)


def client_context(ca_path: Path) -> ssl.SSLContext:
    """A client context that verifies the server against our CA, as the API server does."""
    context = ssl.create_default_context(cafile=str(ca_path))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> Reply:
    """One request on ``conn`` (kept alive unless the server closes it)."""
    conn.request(method, path, body=body, headers=dict(headers or {}))
    response = conn.getresponse()
    return Reply(response.status, response.headers, response.read())


def post_json(conn: http.client.HTTPConnection, path: str, body: bytes) -> Reply:
    return request(conn, "POST", path, body, {"Content-Type": "application/json"})


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels`` (any pid)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def metric_labels(text: str, name: str, label: str, value: float = 1.0) -> set[str]:
    """The values of ``label`` on the samples called ``name`` that equal ``value``."""
    return {
        sample.labels[label]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and sample.value == value
    }


class Server:
    """``gpu-admission serve`` in a subprocess on a free 127.0.0.1 port."""

    def __init__(
        self,
        *,
        policy: Path,
        cert: Path | None,
        key: Path | None,
        ca: Path | None,
        log_path: Path,
        drain_seconds: float = 0.5,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        settings_in_env: bool = False,
        module: str = "webhook.cli",
        cpus: str | None = None,
        vanilla_gunicorn_app: str | None = None,
    ) -> None:
        """``cert`` None serves plain HTTP (``--insecure``). ``settings_in_env`` passes the
        settings as GPU_ADMISSION_* variables instead of options. ``cpus`` pins the server
        and its workers to those CPUs (``taskset -c``), as a CPU limit would hold it.
        ``vanilla_gunicorn_app`` (``module:app``) serves that WSGI app with gunicorn as it
        comes (one gthread worker, 8 threads, as the server has one worker; same bind and
        TLS) instead."""
        self.port = free_port()
        self.ca = ca
        self.log_path = log_path
        self.drain_seconds = drain_seconds
        settings = {
            "policy": str(policy),
            "bind": f"127.0.0.1:{self.port}",
            "drain-seconds": str(drain_seconds),
        }
        if cert is not None and key is not None:
            settings.update(cert=str(cert), key=str(key))
        # The server must read no settings of ours.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_ADMISSION_")}
        self.args = ["taskset", "-c", cpus] if cpus else []
        if vanilla_gunicorn_app is not None:
            self.args += [sys.executable, "-m", "gunicorn", "--worker-class", "gthread"]
            self.args += ["--threads", "8", "--workers", "1"]
            self.args += ["--bind", settings["bind"], "--log-level", "warning"]
            if cert is not None and key is not None:
                self.args += ["--certfile", str(cert), "--keyfile", str(key)]
            self.args.append(vanilla_gunicorn_app)
        else:
            self.args += [sys.executable, "-m", module]
            if module == "webhook.cli":
                self.args.append("serve")
            if settings_in_env:
                for name, value in settings.items():
                    self.env["GPU_ADMISSION_" + name.upper().replace("-", "_")] = value
            else:
                for name, value in settings.items():
                    self.args += [f"--{name}", value]
            if cert is None:
                self.args.append("--insecure")
            self.args += list(extra_args)
        self.env.update(env or {})
        self.process: subprocess.Popen[bytes] | None = None

    # life cycle -----------------------------------------------------------------------

    def start(self, *, timeout: float = 30.0, expect_ready: bool = True) -> Server:
        """Start and wait for /readyz (answered by the worker once its policy is loaded)."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.args,
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own process group, so a stuck server can be killed with its workers.
                start_new_session=True,
                preexec_fn=_terminate_with_parent,
            )
        self.wait_listening(timeout=timeout, expect_ready=expect_ready)
        return self

    def worker_pids(self) -> set[str]:
        """The arbiter's worker (a set: empty while it is being replaced)."""
        return set(self.child_pids())

    def child_pids(self) -> list[str]:
        """The processes the arbiter forked: its worker (a long decision's child is the
        worker's)."""
        assert self.process is not None
        arbiter = self.process.pid
        return Path(f"/proc/{arbiter}/task/{arbiter}/children").read_text().split()

    def connections_per_worker(self) -> dict[int, int]:
        """The established TCP connections to the server's port that each worker process
        holds (Linux: the workers' socket descriptors matched with /proc/net/tcp)."""
        workers = self.child_pids()
        established = set()
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == self.port and fields[3] == "01":  # 01: ESTABLISHED
                established.add(f"socket:[{fields[9]}]")
        counts = {}
        for worker in workers:
            links = []
            try:
                descriptors = list(Path(f"/proc/{worker}/fd").iterdir())
            except FileNotFoundError:
                continue  # exited since it was listed
            for fd in descriptors:
                try:
                    links.append(os.readlink(fd))
                except FileNotFoundError:
                    continue  # closed while listed
            counts[int(worker)] = sum(link in established for link in links)
        return counts

    def wait_listening(self, *, timeout: float, expect_ready: bool) -> None:
        """Wait until /readyz answers (200 when ``expect_ready``, any status otherwise)."""
        deadline = time.monotonic() + timeout
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            self._check_running()
            try:
                conn = self.connection(timeout=2.0)
                try:
                    reply = request(conn, "GET", "/readyz")
                finally:
                    conn.close()
                if reply.status == 200 or not expect_ready:
                    return
                last_error = f"/readyz answered {reply.status}: {reply.body!r}"
            except (OSError, http.client.HTTPException) as exc:
                last_error = repr(exc)
            time.sleep(0.1)
        raise TimeoutError(f"server not ready within {timeout} s: {last_error}\n{self.log()}")

    def _check_running(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")

    def terminate(self) -> None:
        """Send SIGTERM to the arbiter (what the kubelet does)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM, wait for the drain and the graceful stop, else kill the process group."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.terminate()
        try:
            return self.wait(timeout if timeout is not None else self.drain_seconds + 20.0)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
            raise

    def __enter__(self) -> Server:
        return self if self.process is not None else self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_records(self) -> list[dict[str, Any]]:
        """The server's JSON log lines (anything else it printed is skipped)."""
        records = []
        for line in self.log().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    # clients --------------------------------------------------------------------------

    def connection(self, *, timeout: float = 10.0) -> http.client.HTTPConnection:
        """A new keep-alive connection; TLS verified against the test CA."""
        if self.ca is None:
            return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        return http.client.HTTPSConnection(
            "127.0.0.1", self.port, timeout=timeout, context=client_context(self.ca)
        )

    def get(self, path: str) -> Reply:
        conn = self.connection()
        try:
            return request(conn, "GET", path)
        finally:
            conn.close()

    def metrics(self) -> str:
        reply = self.get("/metrics")
        assert reply.status == 200, reply
        return reply.body.decode()


def tls_server(
    directory: Path,
    env: Mapping[str, str] | None = None,
    *,
    policy_text: str = TEST_POLICY,
    extra_args: Sequence[str] = (),
) -> Server:
    """The server (not started: use it in a ``with``) over TLS with new certificates and
    ``policy_text`` (``TEST_POLICY``), all in ``directory``, its log in
    ``directory/server.log``."""
    certificates = make_certificates(directory / "pki")
    policy = directory / "policy.yaml"
    policy.write_text(policy_text)
    return Server(
        policy=policy,
        cert=certificates.tls_cert,
        key=certificates.tls_key,
        ca=certificates.ca_cert,
        log_path=directory / "server.log",
        extra_args=extra_args,
        env=env,
    )


def policy_text(spec: str, name: str = "test") -> str:
    """A policy document with this ``spec`` (YAML lines, indented by the caller's two)."""
    return (
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        f"metadata: {{name: {name}}}\nspec:\n{spec}"
    )


def answers(
    server: Server, reviews: Sequence[Mapping[str, Any]], path: str = "/validate"
) -> list[Any]:
    """The ``response`` of each AdmissionReview, posted on one connection."""
    conn = server.connection()
    try:
        return [
            json.loads(post_json(conn, path, json.dumps(review).encode()).body)["response"]
            for review in reviews
        ]
    finally:
        conn.close()


def peer_serial(conn: http.client.HTTPConnection) -> int:
    """Serial number of the certificate the server presented on ``conn``."""
    from cryptography import x509

    assert conn.sock is not None and isinstance(conn.sock, ssl.SSLSocket)
    der = conn.sock.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def wait_until(predicate: Any, *, timeout: float, interval: float = 0.1, what: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)


def read_all(paths: Iterable[Path]) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in paths}
