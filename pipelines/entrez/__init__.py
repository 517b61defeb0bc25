"""NCBI E-utilities: a rate-limited, caching client and parsers for PubMed records and citation links."""
