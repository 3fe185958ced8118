#!/usr/bin/env python3
"""A real single-node SLURM cluster runs pagedgen as a job array (suite slurm).

usage: test_slurm.py PAGEDGEN

Starts munged, slurmctld and slurmd (Debian's munge and slurm-wlm) by hand
on localhost, with their own key, slurm.conf, state and spool in a temp dir
(no systemd, no cgroups: proctrack/linuxproc, task/none), then:

  1. a single-process run over >= 400 stories260K prompts (the reference);
  2. `sbatch --array=0-3 --requeue` of `pagedgen --shard auto --resume -o DIR/`;
  3. `scancel --signal=KILL` of array task 2 once its output holds records
     and before it finishes; the other three finish;
  4. `pagedgen merge` refuses (exit 1) while shard 2 is unfinished;
  5. `scontrol requeue` of task 2, which resumes its own output;
  6. `pagedgen merge` gives the single run's file byte for byte.

Everything is torn down at the end (daemons stopped, temp dir removed);
every wait is bounded. Skips (exit 77, saying why) only where the daemons
cannot start (slurmd needs to run as root or as the SlurmdUser it names);
the packages missing is a skip outside CI and a failure with CI=true
(scripts/test installs them). Run it alone:
`meson test -C build --suite slurm --print-errorlogs`.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SHARED = os.environ.get("PAGEDGEN_SHARED", "")
MODEL = os.path.join(SHARED, "models", "stories260K")
PROMPTS = 480
TASKS = 4
KILLED = 2
# slow enough per request that task 2 can be caught mid-run on a fast machine
FLAGS = ["--max-num-seqs", "2", "--max-num-batched-tokens", "64", "--threads", "1"]
DAEMONS = ["munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo"]


class Skip(Exception):
    pass


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def free_ports(n):
    """n distinct free TCP ports (all bound at once, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_for(cond, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise Fail(f"timed out after {timeout} s waiting for {what}")


def tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


class Cluster:
    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []
        self.env = dict(os.environ)
        for k in list(self.env):
            if k.startswith("SLURM_"):
                del self.env[k]
        self.env["SLURM_CONF"] = os.path.join(tmp, "slurm.conf")

    def cmd(self, args, timeout=30, check_rc=True):
        p = subprocess.run(args, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        if check_rc and p.returncode != 0:
            raise Fail(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.decode()[-500:]}")
        return p.stdout.decode()

    def start(self):
        t = self.tmp
        key_dir, run_dir = os.path.join(t, "munge-key"), os.path.join(t, "munge-run")
        for d in (key_dir, run_dir, os.path.join(t, "state"), os.path.join(t, "spool"), os.path.join(t, "log")):
            os.makedirs(d)
        os.chmod(t, 0o755)
        os.chmod(key_dir, 0o700)
        os.chmod(run_dir, 0o755)
        key = os.path.join(key_dir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        self.sock = os.path.join(run_dir, "sock")
        # -f: munged refuses a socket under a world-writable /tmp otherwise
        self.procs.append(subprocess.Popen(
            ["munged", "-F", "-f", f"--socket={self.sock}", f"--key-file={key}",
             f"--log-file={os.path.join(t, 'log', 'munged.log')}", f"--pid-file={os.path.join(run_dir, 'pid')}",
             f"--seed-file={os.path.join(key_dir, 'seed')}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            wait_for(lambda: os.path.exists(self.sock), 10, "munged's socket")
        except Fail:
            raise Skip(f"munged did not start: {tail(os.path.join(t, 'log', 'munged.log'))}")
        user = subprocess.run(["id", "-un"], stdout=subprocess.PIPE).stdout.decode().strip()
        host = socket.gethostname().split(".")[0]
        ctld_port, slurmd_port = free_ports(2)
        conf = f"""# pagedgen tests/slurm: one node on localhost, no cgroups, no accounting
ClusterName=pgtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={self.sock}
CredType=cred/munge
SlurmUser={user}
SlurmdUser={user}
StateSaveLocation={t}/state
SlurmdSpoolDir={t}/spool
SlurmctldPidFile={t}/slurmctld.pid
SlurmdPidFile={t}/slurmd.pid
SlurmctldLogFile={t}/log/slurmctld.log
SlurmdLogFile={t}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
JobRequeue=1
InactiveLimit=0
MinJobAge=600
KillWait=2
NodeName=pgnode NodeHostname={host} NodeAddr=127.0.0.1 CPUs={TASKS} State=UNKNOWN
PartitionName=pg Nodes=pgnode Default=YES MaxTime=INFINITE State=UP
"""
        with open(self.env["SLURM_CONF"], "w") as f:
            f.write(conf)
        for args in (["slurmctld", "-D", "-c", "-i"], ["slurmd", "-D", "-N", "pgnode"]):
            with open(os.path.join(t, "log", args[0] + ".stderr"), "wb") as err:
                self.procs.append(subprocess.Popen(args, env=self.env, stdout=subprocess.DEVNULL, stderr=err))

        def node_idle():
            for p in self.procs:
                if p.poll() is not None:
                    log = os.path.join(t, "log", p.args[0])
                    raise Skip(f"{p.args[0]} exited with {p.returncode}:\n{tail(log + '.stderr')}{tail(log + '.log')}")
            p = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=self.env, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, timeout=10)
            return p.returncode == 0 and p.stdout.decode().strip() == "idle"
        try:
            wait_for(node_idle, 30, "the node to be idle")
        except Fail:
            raise Skip("slurmd did not register:\n" + tail(os.path.join(t, "log", "slurmd.log")) +
                       tail(os.path.join(t, "log", "slurmctld.log")))

    def state(self, job):
        """squeue's state of one array task ('' once it has left the queue)."""
        return self.cmd(["squeue", "-h", "-t", "all", "-j", job, "-o", "%t"], check_rc=False).strip()

    def stop(self):
        if getattr(self, "job", None):
            subprocess.run(["scancel", self.job], env=self.env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=30)
        for p in reversed(self.procs):  # slurmd, slurmctld, munged
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)


def write_prompts(path):
    starts = ["Once upon a time", "Tom and his dog", "She said", "The little bird", "Lily went to the park",
              "One day, a big"]
    with open(path, "w") as f:
        for i in range(PROMPTS):
            r = {"id": f"p{i}", "prompt": starts[i % len(starts)], "max_tokens": 48 + (i * 7) % 64,
                 "ignore_eos": True}
            if i % 3 == 1:
                r["temperature"] = 0.8
                r["seed"] = i
            f.write(json.dumps(r) + "\n")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    exe = os.path.abspath(sys.argv[1])
    ci = os.environ.get("CI") == "true"
    if not os.path.isdir(MODEL):
        if ci:
            sys.exit(f"test data missing: {MODEL} (set PAGEDGEN_SHARED)")
        print(f"skip: no test data at {MODEL}")
        sys.exit(77)
    missing = [d for d in DAEMONS if not shutil.which(d)]
    if missing:
        msg = f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge; scripts/test does)"
        if ci:
            sys.exit(f"FAIL slurm: {msg}")
        print(f"skip: {msg}")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="pagedgen-slurm-")
    cluster = Cluster(tmp)
    t0 = time.time()
    try:
        cluster.start()
        print(f"cluster up in {time.time() - t0:.1f} s")
        inp = os.path.join(tmp, "prompts.jsonl")
        write_prompts(inp)
        ref = os.path.join(tmp, "single.jsonl")
        p = subprocess.run([exe, "-m", MODEL, "-q", "-i", inp, "-o", ref] + FLAGS, stderr=subprocess.PIPE,
                           timeout=300)
        check(p.returncode == 0, f"single run: exit {p.returncode}: {p.stderr.decode()[-500:]}")
        print(f"single run done at {time.time() - t0:.1f} s")

        out_dir = os.path.join(tmp, "out")
        os.mkdir(out_dir)
        script = os.path.join(tmp, "array.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\n"
                    f"#SBATCH --array=0-{TASKS - 1}\n"
                    "#SBATCH --requeue\n"
                    "#SBATCH --open-mode=append\n"
                    f"exec {exe} -m {MODEL} -i {inp} -o {out_dir}/ --shard auto --resume --log-interval 60 "
                    + " ".join(FLAGS) + "\n")
        job = cluster.cmd(["sbatch", "--parsable", "-n", "1", "-c", "1",
                           "-o", os.path.join(tmp, "log", "task_%a.out"), script]).strip().split(";")[0]
        cluster.job = job
        shard = [os.path.join(out_dir, f"prompts.{k}-of-{TASKS}.jsonl") for k in range(TASKS)]
        victim = f"{job}_{KILLED}"
        per_shard = PROMPTS // TASKS
        # kill task 2 once it has written some records, while it still runs
        deadline = time.time() + 120
        while count_lines(shard[KILLED]) < 4 and time.time() < deadline:
            time.sleep(0.002)
        cluster.cmd(["scancel", "--signal=KILL", victim])
        n = count_lines(shard[KILLED])
        check(4 <= n < per_shard and not os.path.exists(shard[KILLED] + ".done"),
              f"task {KILLED} was not caught mid-run ({n} of {per_shard} records)")
        wait_for(lambda: cluster.state(victim) not in ("R", "CG", ""), 30, f"task {KILLED} to die")
        print(f"task {KILLED} killed with {count_lines(shard[KILLED])} of {per_shard} records "
              f"at {time.time() - t0:.1f} s (state {cluster.state(victim)})")
        check(not os.path.exists(shard[KILLED] + ".done"), "a killed task left a marker")
        others = [k for k in range(TASKS) if k != KILLED]
        wait_for(lambda: all(os.path.exists(shard[k] + ".done") for k in others), 180, "the other tasks")
        wait_for(lambda: all(cluster.state(f"{job}_{k}") in ("CD", "") for k in others), 30,
                 "the other tasks to complete")

        # merge refuses while a shard is unfinished, or missing
        merged = os.path.join(tmp, "merged.jsonl")
        p = subprocess.run([exe, "merge", "-i", inp, "-o", merged] + shard, stderr=subprocess.PIPE, timeout=60)
        check(p.returncode == 1 and b"has no marker" in p.stderr and not os.path.exists(merged),
              f"merge with task {KILLED} unfinished: exit {p.returncode}: {p.stderr.decode()[-800:]}")
        p = subprocess.run([exe, "merge", "-i", inp, "-o", merged] + [shard[k] for k in others],
                           stderr=subprocess.PIPE, timeout=60)
        check(p.returncode == 1 and b"missing" in p.stderr and not os.path.exists(merged),
              f"merge without shard {KILLED}: exit {p.returncode}: {p.stderr.decode()[-800:]}")

        # requeue: SLURM holds a requeued batch job for a while (its
        # EligibleTime); StartTime=now lets it run at once
        cluster.cmd(["scontrol", "requeue", victim])
        cluster.cmd(["scontrol", "update", f"JobId={victim}", "StartTime=now"])
        wait_for(lambda: os.path.exists(shard[KILLED] + ".done"), 180, f"requeued task {KILLED} to finish")
        wait_for(lambda: cluster.state(victim) in ("CD", ""), 30, f"requeued task {KILLED} to complete")
        log = open(os.path.join(tmp, "log", f"task_{KILLED}.out"), errors="replace").read()
        check("--resume:" in log and "records kept" in log, f"the requeued task did not resume:\n{log[-800:]}")
        print(f"requeued task {KILLED} done at {time.time() - t0:.1f} s: "
              + [l for l in log.splitlines() if "records kept" in l][-1])

        p = subprocess.run([exe, "merge", "-i", inp, "-o", merged] + shard, stderr=subprocess.PIPE, timeout=60)
        check(p.returncode == 0, f"merge: exit {p.returncode}: {p.stderr.decode()[-800:]}")
        got, want = open(merged, "rb").read(), open(ref, "rb").read()
        check(got == want, f"merged file ({len(got)} bytes) differs from the single run ({len(want)} bytes)")
        check(want.count(b"\n") == PROMPTS, "the single run is short")
        print(f"ok slurm: {PROMPTS} requests over {TASKS} array tasks, one killed and requeued, merged = single "
              f"run byte for byte ({time.time() - t0:.1f} s)")
    except Skip as e:
        print(f"skip: {e}")
        return 77
    except Fail as e:
        print(f"FAIL slurm: {e}")
        for name in ("slurmctld.log", "slurmd.log"):
            print(f"--- {name}\n{tail(os.path.join(tmp, 'log', name))}")
        return 1
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
