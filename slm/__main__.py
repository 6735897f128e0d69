from slm.entry import main

main()
