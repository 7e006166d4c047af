pytest_plugins = ["fixtures_ssh", "fixtures_netns", "fixtures_repo", "fixtures_services", "fixtures_memory",
                  "fixtures_containers"]
