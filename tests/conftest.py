pytest_plugins = ["fixtures_ssh", "fixtures_repo", "fixtures_services"]
