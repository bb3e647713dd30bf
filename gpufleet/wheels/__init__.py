"""Wheels onto hosts: the control node's cache, what pip on a host needs, pushing files."""
