from deployer.launch import main

main()
