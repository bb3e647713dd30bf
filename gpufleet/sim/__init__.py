"""The simulated fleet: stand-in wheels, package index, upstream sglang repo, fake nvidia-smi, containers."""
