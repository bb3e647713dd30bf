"""Talking to hosts: commands as data, one SSH session per host, parallel runs, detached long commands."""
