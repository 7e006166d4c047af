pytest_plugins = ["fixtures_ssh"]
