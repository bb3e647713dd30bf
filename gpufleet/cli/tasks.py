"""gpufleet's command line: thin Invoke tasks over gpufleet.cli (run `inv --list`)."""

from invoke import Collection, Exit, task

from gpufleet.cli import common as cli
from gpufleet.cli import exit_without_collecting

exit_without_collecting()

_ROLL = {
    "canary": "with several hosts: the host to upgrade first, alone (default: the first selected)",
    "batch": "with several hosts: hosts per batch after the canary, a number or a percentage like 25% (default 1)",
    "max-fail": "with several hosts: stop the roll once more hosts than this have failed: a number, or a percentage "
                "of the roll's hosts like 10% (default 0)",
    "resume": "continue the last stopped roll after its last completed host",
    "no-rollback": "leave a host that fails its health gate as it is instead of restoring its snapshot",
    "hf-token-file": "file holding the Hugging Face token (default: $HF_TOKEN); kept in a 0600 env file, never shown",
    "drain-timeout": "with a [router]: seconds a drained server's requests in flight may take (default: the "
                     "inventory's router.drain_timeout, 300)",
    "on-drain-timeout": "with a [router]: cut (stop the server anyway, with a warning) or wait (keep waiting) when "
                        "requests are still in flight at the drain timeout (default: router.on_drain_timeout, cut)",
    "no-speed-gate": "skip the throughput gate (decode speed before the stop vs after the health gate)",
}

_COMMON = {
    "inventory": "inventory TOML (default: $GPUFLEET_INVENTORY, else hosts/sim.toml written by `inv sim.up`)",
    "stack": "target stack TOML (default: $GPUFLEET_STACK, else stack.toml)",
    "host": "one host by name",
    "hosts": "hosts by name, group or `all`, comma-separated",
    "json": "print machine-readable JSON instead of tables",
    "accept-new-host-keys": "trust and record keys of hosts never seen before (never a changed key)",
    "parallel": "how many hosts at once (default: the inventory's settings.parallelism)",
}

_ROLES = {
    "only": "run only these roles, comma-separated (torch, flashinfer, locked-packages, sglang-checkout, "
            "sgl-kernel, verify); the others are shown as skipped",
    "skip": "leave these roles out, comma-separated; a role that needs a left-out role not on target on a host is "
            "refused there, naming it",
    "force": "with --only/--skip: run a role although a role it needs is left out and not on target",
}


def fleet_task(**kwargs):
    """A task over hosts: long flags only, since an automatic -h for --host would shadow -h for help."""
    return task(auto_shortflags=False, **kwargs)


def resolve(task: str, **options):
    """gpufleet.cli.target's resolve, imported when a task runs: it brings pydantic and the config models (~0.1 s),
    which `inv status` loads while its logins are under way (cli/early.py)."""
    from gpufleet.cli.target import resolve as resolved

    return resolved(task, **options)


def role_selection(only, skip, force):
    from gpufleet.cli.target import role_selection as selected

    return selected(only, skip, force)


def _roll(canary, batch, max_fail, resume, no_rollback, drain_timeout=None, on_drain_timeout=None,
          no_speed_gate=False):
    from gpufleet.cli.target import RollOptions

    return RollOptions(canary=canary, batch=batch, max_fail=max_fail, resume=resume, no_rollback=no_rollback,
                       drain_timeout=drain_timeout, on_drain_timeout=on_drain_timeout, no_speed_gate=no_speed_gate)


def _exit(code: int) -> None:
    if code:
        raise Exit(code=code)


@fleet_task(help=_COMMON)
@cli.user_errors
def facts(c, host=None, hosts=None, inventory=None, stack=None, json=False, accept_new_host_keys=False,
          parallel=None):
    """Show what a host is: GPUs, OS, CPU/RAM/disk, stack versions in its venv, sglang checkout, service."""
    _exit(cli.facts(resolve("facts", inventory=inventory, stack=stack, host=host, hosts=hosts, json=json,
                            accept_new_host_keys=accept_new_host_keys, per_host_stacks=False, parallel=parallel)))


@fleet_task(help={**_COMMON, "lock": "compare hosts with this fleet lock instead: every distribution that differs, "
                                     "is absent or is extra, the sglang commit, the sgl-kernel build"})
@cli.user_errors
def status(c, host=None, hosts=None, inventory=None, stack=None, json=False, accept_new_host_keys=False, lock=None,
           parallel=None):
    """Compare each host with stack.toml (or a fleet lock): one row per host, drift highlighted; exit 1 on drift or
    unreachable."""
    if lock:
        from gpufleet.cli import lock_status as lock_cmd

        _exit(lock_cmd.lock_status(resolve("status", inventory=inventory, stack=stack, host=host, hosts=hosts,
                                           all_by_default=True, json=json, accept_new_host_keys=accept_new_host_keys,
                                           lock=lock, per_host_stacks=False, parallel=parallel)))
        return
    from gpufleet.cli import early

    with early.begin("status", inventory=inventory,
                     flags=_login_flags(host, hosts, accept_new_host_keys, parallel)) as logins:
        target = resolve("status", inventory=inventory, stack=stack, host=host, hosts=hosts, all_by_default=True,
                         json=json, accept_new_host_keys=accept_new_host_keys, per_host_stacks=True,
                         parallel=parallel)
        code = cli.status(target, opened=logins.confirm(target.hosts, target.inventory.settings))
    _exit(code)


@fleet_task(help={**_COMMON,
                  "fetch": "git fetch origin first (default); --no-fetch judges against origin as last fetched"})
@cli.user_errors
def patches(c, host=None, hosts=None, inventory=None, stack=None, json=False, accept_new_host_keys=False, fetch=True,
            parallel=None):
    """Each patch of patches/sglang and patches/sgl-kernel on each host: applied, will apply, upstreamed, conflicts."""
    from gpufleet.cli import patches as patches_cmd

    _exit(patches_cmd.patches(resolve("patches", inventory=inventory, stack=stack, host=host, hosts=hosts,
                                      all_by_default=True, json=json, accept_new_host_keys=accept_new_host_keys,
                                      parallel=parallel),
                              fetch=fetch))


@fleet_task(help={**_COMMON, **_ROLL, **_ROLES,
                   "dry-run": "print each host's plan (steps with reasons, what stays) and change nothing",
                   "lock": "converge hosts to this fleet lock (locks/*.toml): its exact distributions, sglang commit "
                           "and sgl-kernel build, instead of recording a new one from the canary"})
@cli.user_errors
def upgrade(c, host=None, hosts=None, inventory=None, stack=None, json=False, accept_new_host_keys=False,
            dry_run=False, canary=None, batch="1", max_fail="0", resume=False, no_rollback=False, hf_token_file=None,
            lock=None, parallel=None, only=None, skip=None, force=False, drain_timeout=None, on_drain_timeout=None,
            no_speed_gate=False):
    """Bring hosts to stack.toml: torch, flashinfer, sglang checkout + patches, sgl-kernel, whole-stack check.

    One host: the upgrade alone. Several hosts: a roll, canary first then batches; each host is stopped, upgraded,
    deployed and proven healthy, or rolled back; the roll stops past --max-fail. The canary's proven stack is
    recorded as a fleet lock (locks/) and every later host installs exactly that set. --only/--skip run part of
    the stack (then no lock is recorded)."""
    from gpufleet.cli import early

    # a resumed roll surveys only the hosts it has left: those log in once it knows them
    with early.begin("upgrade", inventory=inventory, flags=_login_flags(host, hosts, accept_new_host_keys, parallel),
                     skip=resume) as logins:
        target = resolve("upgrade", inventory=inventory, stack=stack, host=host, hosts=hosts, json=json,
                         accept_new_host_keys=accept_new_host_keys, dry_run=dry_run, lock=lock,
                         hf_token_file=hf_token_file, roll=_roll(canary, batch, max_fail, resume, no_rollback,
                                                                 drain_timeout, on_drain_timeout, no_speed_gate),
                         parallel=parallel, chosen_roles=role_selection(only, skip, force))
        begun = logins.confirm(target.hosts, target.inventory.settings)
        with begun or _opened_ahead(target) as opened:
            from gpufleet.cli import roll as roll_cmd  # the roles and the roll: imported while the hosts answer
            from gpufleet.cli import upgrade as upgrade_cmd

            code = roll_cmd.roll(target, opened=opened) if target.rolls else upgrade_cmd.upgrade(target, opened=opened)
    _exit(code)


def _login_flags(host, hosts, accept_new_host_keys, parallel) -> dict:
    """The flags that decide which hosts a task logs in to and how: part of the key of its remembered logins."""
    return {"host": host, "hosts": hosts, "accept_new_host_keys": accept_new_host_keys, "parallel": parallel}


def _opened_ahead(target, secrets: tuple[str, ...] = ()):
    """The sessions a task's first pass over its hosts takes, opened while its modules load: a roll's survey (every
    host, with the task's secrets; none when resuming: a resumed roll surveys only some) or, with the secrets that
    pass masks (secrets), the single run's."""
    from gpufleet.engine.runner import open_ahead  # paramiko

    if target.rolls:
        return open_ahead([] if target.resumed else list(target.hosts), target.inventory, target.hidden)
    return open_ahead(list(target.hosts), target.inventory, secrets)


@fleet_task(name="deploy-model", help={
    **_COMMON, **_ROLL, "dry-run": "print each host's plan (the unit's diff, what restarts) and change nothing",
    "download": "download missing model files on the host with the Hugging Face CLI (hf / huggingface-cli)"})
@cli.user_errors
def deploy_model(c, host=None, hosts=None, inventory=None, stack=None, json=False, accept_new_host_keys=False,
                 dry_run=False, download=False, hf_token_file=None, canary=None, batch="1", max_fail="0", resume=False,
                 no_rollback=False, parallel=None, drain_timeout=None, on_drain_timeout=None, no_speed_gate=False):
    """Install or update the SGLang unit (restart only on change), then prove /health and a smoke generation.

    Several hosts roll: canary first, then batches, each proven healthy (or rolled back) before the next."""
    target = resolve("deploy-model", inventory=inventory, stack=stack, host=host, hosts=hosts, json=json,
                     accept_new_host_keys=accept_new_host_keys, dry_run=dry_run, token=True,
                     hf_token_file=hf_token_file, download=download,
                     roll=_roll(canary, batch, max_fail, resume, no_rollback, drain_timeout, on_drain_timeout,
                                no_speed_gate), parallel=parallel)
    with _opened_ahead(target, target.hidden) as opened:
        from gpufleet.cli import deploy as deploy_cmd  # the model-server role and the roll: loaded while hosts answer
        from gpufleet.cli import roll as roll_cmd

        code = roll_cmd.roll(target, opened=opened) if target.rolls else deploy_cmd.deploy_model(target, opened)
    _exit(code)


@fleet_task(help={**_COMMON, "snapshot": "restore this snapshot directory (default: the host's newest)",
                   "dry-run": "say what would be restored and change nothing"})
@cli.user_errors
def rollback(c, host=None, hosts=None, inventory=None, stack=None, snapshot=None, json=False,
             accept_new_host_keys=False, dry_run=False, parallel=None):
    """Put hosts back on the snapshot taken before their last upgrade: exact venv, sglang HEAD and edits, unit."""
    from gpufleet.cli import rollback as rollback_cmd

    _exit(rollback_cmd.rollback_hosts(resolve("rollback", inventory=inventory, stack=stack, host=host, hosts=hosts,
                                              json=json, accept_new_host_keys=accept_new_host_keys, dry_run=dry_run,
                                              per_host_stacks=False, parallel=parallel),
                                      snapshot=snapshot))


@fleet_task(name="probe-backends", help={
    **{k: v for k, v in _COMMON.items() if k != "parallel"},  # probes run one host at a time
    "apply": "write the fastest correct set into the host's inventory entry and redeploy it",
    "dry-run": "list the candidate backend sets (and with --json each one's argv) and change nothing",
    "hf-token-file": _ROLL["hf-token-file"] + " (used by --apply's redeploy)"})
@cli.user_errors
def probe_backends(c, host=None, hosts=None, inventory=None, stack=None, json=False, accept_new_host_keys=False,
                   apply=False, dry_run=False, hf_token_file=None):
    """Start the server with each backend set of [probe] (attention x MoE x FP4 GEMM x speculative), check known
    answers, measure tokens/s and load time, show the table; the host serves again afterwards.

    The production server is stopped meanwhile and put back (or, with --apply, redeployed with the fastest
    correct set); hosts are probed one after another under their host lock. Exit 1 when no set was correct."""
    from gpufleet.cli import probe as probe_cmd

    _exit(probe_cmd.probe_backends(resolve("probe-backends", inventory=inventory, stack=stack, host=host,
                                           hosts=hosts, json=json, accept_new_host_keys=accept_new_host_keys,
                                           dry_run=dry_run, token=apply, hf_token_file=hf_token_file),
                                   apply=apply))


@fleet_task(help={**_COMMON, "force": "remove the lock even when its holder may still run (from this control node: "
                                    "its pid is alive; from another: gpufleet cannot tell)"})
@cli.user_errors
def unlock(c, host=None, hosts=None, inventory=None, stack=None, json=False, accept_new_host_keys=False, force=False,
           parallel=None):
    """Show who holds a host's lock (/var/lib/gpufleet/lock) and remove it when that run is gone.

    A holder on this control node is live while its pid runs (the same process that took the lock); a holder from
    another control node cannot be checked from here. A live or unknown holder is refused unless --force; a lock
    whose holder is gone is removed, and only while it is still that lock."""
    from gpufleet.cli import unlock as unlock_cmd

    _exit(unlock_cmd.unlock(resolve("unlock", inventory=inventory, stack=stack, host=host, hosts=hosts, json=json,
                                    accept_new_host_keys=accept_new_host_keys, per_host_stacks=False,
                                    parallel=parallel), force=force))


@fleet_task(help=_COMMON)
@cli.user_errors
def snapshots(c, host=None, hosts=None, inventory=None, stack=None, json=False, accept_new_host_keys=False,
              parallel=None):
    """List each host's snapshots (newest first) with date, size, who took them and with what command.

    After a successful upgrade or deploy a host keeps its newest settings.snapshots_keep (default 5), never the
    one that run took."""
    from gpufleet.cli import snapshots as snapshots_cmd

    _exit(snapshots_cmd.snapshots(resolve("snapshots", inventory=inventory, stack=stack, host=host, hosts=hosts,
                                          all_by_default=True, json=json,
                                          accept_new_host_keys=accept_new_host_keys, per_host_stacks=False,
                                          parallel=parallel)))


@task(name="up", help={"count": "how many simulated GPU servers to boot (default 3)",
                        "inventory": "where to write their inventory (default hosts/sim.toml)"})
@cli.user_errors
def sim_up(c, count=3, inventory=None):
    """Boot N simulated Blackwell servers (systemd-nspawn, real sshd) and write their inventory."""
    from gpufleet.sim import cli as sim_cli

    sim_cli.up(count, inventory)


@task(name="down")
@cli.user_errors
def sim_down(c):
    """Stop the simulated fleet and remove every process, mount, link, namespace and cgroup it made."""
    from gpufleet.sim import cli as sim_cli

    sim_cli.down()


@task(name="status", help={"json": "print JSON"})
@cli.user_errors
def sim_status(c, json=False):
    """Show the simulated hosts: address, container running, sshd answering."""
    from gpufleet.sim import cli as sim_cli

    _exit(sim_cli.status(json))


@task(help={"directory": "where to write (made if missing; default: the fleet directory: --fleet, $GPUFLEET_DIR, "
                        "else here); the installed command also takes it bare: `gpufleet init DIR`"})
@cli.user_errors
def init(c, directory=None):
    """Write a commented starting fleet: hosts/example.toml, stack.toml and patches/ (the site's series); an existing
    file is never overwritten (nothing is written, and the files in the way are named)."""
    from gpufleet.cli import init as init_cmd
    from gpufleet.cli.fleetdir import fleet_dir

    init_cmd.init(directory or fleet_dir())


ns = Collection(facts, status, upgrade)
ns.add_task(deploy_model)
ns.add_task(patches)
ns.add_task(rollback)
ns.add_task(probe_backends)
ns.add_task(unlock)
ns.add_task(snapshots)
ns.add_task(init)
ns.add_collection(Collection("sim", sim_up, sim_down, sim_status))
