"""Code that runs on the hosts, shipped as files and loaded with importlib.resources."""
