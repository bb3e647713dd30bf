"""The command line: what each Invoke task does, rendering, live progress."""
