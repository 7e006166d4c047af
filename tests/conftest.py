pytest_plugins = ["fixtures_ssh", "fixtures_repo"]
