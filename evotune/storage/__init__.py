"""Storage: Optuna studies (sqlite, journal file, any RDB), the trial writer and the claims beside them."""
