"""The test kit (like fabric.testing): fake sessions and plan contexts that unit tests share."""
