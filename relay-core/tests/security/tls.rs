//! Encrypted LAN joins without a CA: the proxy's own TLS, and workers pinned to its certificate.
