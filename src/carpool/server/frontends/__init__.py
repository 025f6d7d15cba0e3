"""--frontends N: front-end processes sharing the main process's batchers."""
