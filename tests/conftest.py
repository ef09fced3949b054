# The rdmalab plugin (fixtures lab, lab_factory, hosts, personality; marker requires) for every
# test under tests/, and pytester for the plugin's own tests in tests/python.
pytest_plugins = ["rdmalab.run.pytest_plugin", "pytester"]
