"""A real single-node Slurm for the tests: munged, slurmctld and slurmd on this machine.

Everything lives in one folder the test owns: a fresh munge key and socket, a generated
``slurm.conf`` (one node with this machine's cores and memory, one partition, no
accounting database), the daemons' state, spool and logs. Nothing under /etc is read or
written, so it runs beside a system Slurm and leaves nothing behind. The daemons run as
the current user, which must be root: slurmd starts jobs as their submitting user.

Slurm's clients (sbatch, squeue, scancel) find this cluster through ``SLURM_CONF``, which
:func:`start_slurm` returns for the caller to put in the environment.

Debian: ``apt-get install slurm-wlm munge`` (``.ci/run`` does it in CI).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "sinfo")


def missing_slurm() -> str:
    """Why a single-node Slurm cannot start here, or "" when it can."""
    missing = [name for name in DAEMONS + CLIENTS
               if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing): "
                "`apt-get install slurm-wlm munge` enables the Slurm tests (.ci/run does)")
    if os.geteuid() != 0:
        return "the single-node Slurm runs its daemons as root: run the Slurm tests as root"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _daemon(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class SingleNodeSlurm:
    """A running single-node Slurm: its folder, configuration, node name and CPUs."""

    root: Path
    conf: Path
    node: str
    cpus: int

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def jobs(self) -> list[tuple[str, str]]:
        """(job id, state) of every job squeue lists."""
        out = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=os.environ | self.env,
                             capture_output=True, text=True, check=True).stdout
        return [tuple(line.split()[:2]) for line in out.splitlines() if line.strip()]

    def logs(self) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log"):
            path = self.root / name
            if path.exists():
                parts.append(f"--- {name}\n" + path.read_text(errors="replace")[-4000:])
        return "\n".join(parts)

    def stop(self) -> None:
        # Jobs first, so that no worker outlives the test; then the daemons.
        subprocess.run(["scancel", "--full", "-u", "root"], env=os.environ | self.env,
                       capture_output=True, check=False)
        for pidfile in ("slurmd.pid", "slurmctld.pid"):
            path = self.root / pidfile
            if path.exists():
                try:
                    os.kill(int(path.read_text().strip()), 15)
                except (ValueError, ProcessLookupError):
                    pass
        munge_pid = self.root / "munged.pid"
        if munge_pid.exists():
            try:
                os.kill(int(munge_pid.read_text().strip()), 15)
            except (ValueError, ProcessLookupError):
                pass
        time.sleep(1)


def start_slurm(root: Path, timeout_s: float = 60.0) -> SingleNodeSlurm:
    """Start munged, slurmctld and slurmd in ``root``; return when the node is idle."""
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool"):
        (root / sub).mkdir(exist_ok=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    munge_socket = root / "munge.socket"
    subprocess.run(
        [_daemon("munged"), "--force", f"--key-file={key}", f"--socket={munge_socket}",
         f"--pid-file={root / 'munged.pid'}", f"--log-file={root / 'munged.log'}",
         f"--seed-file={root / 'munged.seed'}"],
        check=True, capture_output=True,
    )
    node = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    memory_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.9)
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=mriprep-test",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "ReturnToService=2",
        # A cancelled job's processes get SIGTERM, then SIGKILL this many seconds later.
        "KillWait=5",
        # Finished jobs stay visible to scontrol for this long (their fate is read there).
        "MinJobAge=600",
        "SchedulerParameters=sched_interval=2",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
        f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP",
        "",
    ]))
    env = os.environ | {"SLURM_CONF": str(conf)}
    for daemon in ("slurmctld", "slurmd"):
        args = [_daemon(daemon), "-f", str(conf)]
        if daemon == "slurmctld":
            args.append("-c")  # clean start: no state from an earlier cluster
        subprocess.run(args, env=env, check=True, capture_output=True)
    cluster = SingleNodeSlurm(root=root, conf=conf, node=node, cpus=cpus)
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env,
                             capture_output=True, text=True)
        state = out.stdout.strip()
        if out.returncode == 0 and state.startswith("idle"):
            return cluster
        time.sleep(0.5)
    cluster.stop()
    raise RuntimeError(f"the single-node Slurm did not come up in {timeout_s:.0f} s "
                       f"(node state {state!r}):\n{cluster.logs()}")
