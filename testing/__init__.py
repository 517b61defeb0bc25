"""What tests, benchmarks and ``make demo`` need and the installed product does not: loopback
stand-ins for PMC, NCBI and the FTP mirrors (``pyftpdlib`` is a dev-only dependency)."""
