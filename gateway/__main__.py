from gateway.cli import main

if __name__ == "__main__":  # spawned engine processes import this module too
    main()
