"""gpufleet's command line: thin Invoke tasks over gpufleet.cli (run `inv --list`)."""

from invoke import Collection, Exit, task

from gpufleet import cli

_COMMON = {
    "inventory": "inventory TOML (default: $GPUFLEET_INVENTORY, else hosts/sim.toml written by `inv sim.up`)",
    "stack": "target stack TOML (default: $GPUFLEET_STACK, else stack.toml)",
    "host": "one host by name",
    "hosts": "hosts by name, group or `all`, comma-separated",
    "json": "print machine-readable JSON instead of tables",
    "accept-new-host-keys": "trust and record keys of hosts never seen before (never a changed key)",
}


def fleet_task(**kwargs):
    """A task over hosts: long flags only, since an automatic -h for --host would shadow -h for help."""
    return task(auto_shortflags=False, **kwargs)


def _exit(code: int) -> None:
    if code:
        raise Exit(code=code)


@fleet_task(help=_COMMON)
@cli.user_errors
def facts(c, host=None, hosts=None, inventory=None, stack=None, json=False, accept_new_host_keys=False):
    """Show what a host is: GPUs, OS, CPU/RAM/disk, stack versions in its venv, sglang checkout, service."""
    _exit(cli.facts(inventory, stack, host, hosts, json, accept_new_host_keys))


@fleet_task(help=_COMMON)
@cli.user_errors
def status(c, host=None, hosts=None, inventory=None, stack=None, json=False, accept_new_host_keys=False):
    """Compare each host with stack.toml: one row per host, drift highlighted; exit 1 on drift or unreachable."""
    _exit(cli.status(inventory, stack, host, hosts, json, accept_new_host_keys))


@fleet_task(help={**_COMMON,
                  "fetch": "git fetch origin first (default); --no-fetch judges against origin as last fetched"})
@cli.user_errors
def patches(c, host=None, hosts=None, inventory=None, stack=None, json=False, accept_new_host_keys=False, fetch=True):
    """Each patch of patches/sglang and patches/sgl-kernel on each host: applied, will apply, upstreamed, conflicts."""
    from gpufleet import cli_patches

    _exit(cli_patches.patches(inventory, stack, host, hosts, json, accept_new_host_keys, fetch))


@fleet_task(help={**_COMMON, "dry-run": "print each host's plan (steps with reasons, what stays) and change nothing"})
@cli.user_errors
def upgrade(c, host=None, hosts=None, inventory=None, stack=None, json=False, accept_new_host_keys=False,
            dry_run=False):
    """Bring hosts to stack.toml (torch, flashinfer, then a whole-stack check); --dry-run shows the plan."""
    from gpufleet import cli_upgrade

    _exit(cli_upgrade.upgrade(inventory, stack, host, hosts, json, accept_new_host_keys, dry_run))


@fleet_task(name="deploy-model", help={
    **_COMMON, "dry-run": "print each host's plan (the unit's diff, what restarts) and change nothing",
    "download": "download missing model files on the host with the Hugging Face CLI (hf / huggingface-cli)",
    "hf-token-file": "file holding the Hugging Face token (default: $HF_TOKEN); kept in a 0600 env file, never shown"})
@cli.user_errors
def deploy_model(c, host=None, hosts=None, inventory=None, stack=None, json=False, accept_new_host_keys=False,
                 dry_run=False, download=False, hf_token_file=None):
    """Install or update the SGLang unit (restart only on change), then prove /health and a smoke generation."""
    from gpufleet import cli_deploy

    _exit(cli_deploy.deploy_model(inventory, stack, host, hosts, dry_run, json, download, hf_token_file,
                                  accept_new_host_keys))


@fleet_task(help={**_COMMON, "snapshot": "restore this snapshot directory (default: the host's newest)",
                   "dry-run": "say what would be restored and change nothing"})
@cli.user_errors
def rollback(c, host=None, hosts=None, inventory=None, stack=None, snapshot=None, json=False,
             accept_new_host_keys=False, dry_run=False):
    """Put hosts back on the snapshot taken before their last upgrade: exact venv, sglang HEAD and edits, unit."""
    from gpufleet import cli_rollback

    _exit(cli_rollback.rollback_hosts(inventory, stack, host, hosts, snapshot, dry_run, json, accept_new_host_keys))


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


ns = Collection(facts, status, upgrade)
ns.add_task(deploy_model)
ns.add_task(patches)
ns.add_task(rollback)
ns.add_collection(Collection("sim", sim_up, sim_down, sim_status))
