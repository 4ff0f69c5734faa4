from simumax.cli import main

main()
