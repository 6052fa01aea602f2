from flagtrial.cli import main

main()
