"""What happens to hosts: the executor, host state, health, rollback, rolls, fleet locks compared, status."""
