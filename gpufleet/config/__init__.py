"""What the user writes: the inventory, the target stack, fleet lock files; each validated."""
