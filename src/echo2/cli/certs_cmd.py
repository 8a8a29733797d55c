"""`echo2 certs`: make a private CA and issue the server certificates a run's TLS needs
(`ca`, then `issue` once per machine that serves: the learner's, and every worker with a relay)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("certs", help="make a CA and TLS server certificates for a run")
    actions = parser.add_subparsers(dest="action", required=True)
    ca = actions.add_parser("ca", help="make a CA: ca.pem (give to every role) and ca.key (keep private)")
    ca.add_argument("--out", required=True, help="directory for ca.pem and ca.key")
    ca.add_argument("--common-name", default="echo2 CA", help="the CA's name inside its certificate")
    ca.add_argument("--days", type=int, default=3650, help="validity in days (default 3650)")
    ca.add_argument("--force", action="store_true", help="replace an existing CA (every certificate must be reissued)")
    issue = actions.add_parser("issue", help="issue a server certificate signed by the CA")
    issue.add_argument("--ca-dir", required=True, help="directory holding ca.pem and ca.key")
    issue.add_argument("--name", required=True, help="names the files, e.g. learner or worker-3")
    issue.add_argument("--host", action="append", default=[], metavar="HOST",
                       help="a DNS name or IP address peers use to reach this machine (repeatable)")
    issue.add_argument("--out", help="directory for NAME.pem and NAME.key (default: --ca-dir)")
    issue.add_argument("--days", type=int, default=825, help="validity in days (default 825)")
    issue.add_argument("--force", action="store_true", help="replace existing NAME.pem and NAME.key")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from echo2.protocol import certs

    if args.action == "ca":
        made = certs.make_ca(Path(args.out), common_name=args.common_name, days=args.days, force=args.force)
        print(f"wrote {made.cert_path}  CA certificate (public), valid until {made.not_after:%Y-%m-%d}: copy it to "
              "every machine of the run and set tls.ca_file to it")
        print(f"wrote {made.key_path}  CA private key (mode 0600): keep it on this machine, it only signs certificates")
        print(f"next, one per serving machine: echo2 certs issue --ca-dir {args.out} --name NAME --host HOST")
        return 0
    out = Path(args.out) if args.out else None
    made = certs.issue(Path(args.ca_dir), args.name, args.host, out_dir=out, days=args.days, force=args.force)
    ca_pem = Path(args.ca_dir) / certs.CA_CERT
    print(f"wrote {made.cert_path}  certificate for {', '.join(args.host)}, valid until {made.not_after:%Y-%m-%d}")
    print(f"wrote {made.key_path}  its private key (mode 0600): copy it only to that machine, over a secure channel")
    print("use them there (paths as they will be on that machine), e.g. for a worker:")
    print(f"  echo2 worker --coordinator https://... --set tls.cert_file={made.cert_path} "
          f"--set tls.key_file={made.key_path} --set tls.ca_file={ca_pem}")
    print("or, on the learner's machine, the same three fields under [tls] of the run config")
    return 0
