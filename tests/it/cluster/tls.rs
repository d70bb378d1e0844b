//! A TLS-secured etcd (`--client-cert-auth`, the way a Kubernetes control plane runs it):
//! the pool commands and a node's daemon reach it with `--etcd-ca-file`,
//! `--etcd-cert-file` and `--etcd-key-file`; without a client certificate they are refused.

use super::*;
use std::path::Path;

/// A CA, a server certificate for 127.0.0.1 and a client certificate signed by it (PEM,
/// made with openssl for this test only).
fn make_certs(dir: &Path) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl (apt-get install openssl)");
        stdout_ok(&format!("openssl {}", args.join(" ")), &out);
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=cnikit-test-ca",
    ]);
    let ext = "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n";
    std::fs::write(dir.join("ext.cnf"), ext).expect("write ext.cnf");
    for who in ["server", "client"] {
        let (key, csr, pem) = (
            format!("{who}-key.pem"),
            format!("{who}.csr"),
            format!("{who}.pem"),
        );
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={who}"),
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "1",
            "-extfile",
            "ext.cnf",
        ]);
    }
}

/// One etcd member serving clients over TLS only, requiring client certificates.
struct TlsEtcd {
    child: Child,
    endpoint: String,
}

impl TlsEtcd {
    fn start(env: &TestEnv, certs: &Path) -> TlsEtcd {
        let port = NEXT_PORT.fetch_add(2, Ordering::SeqCst);
        let (client, peer) = (
            format!("https://127.0.0.1:{port}"),
            format!("http://127.0.0.1:{}", port + 1),
        );
        let dir = env.dir("etcd-tls");
        let log = std::fs::File::create(dir.join("etcd.log")).expect("etcd log");
        let pem = |name: &str| certs.join(name);
        let child = Command::new("etcd")
            .args(["--name", "m0", "--data-dir"])
            .arg(dir.join("data"))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=m0={peer}"))
            .arg("--cert-file")
            .arg(pem("server.pem"))
            .arg("--key-file")
            .arg(pem("server-key.pem"))
            .arg("--trusted-ca-file")
            .arg(pem("ca.pem"))
            .arg("--client-cert-auth")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("run etcd (apt-get install etcd-server)");
        TlsEtcd {
            child,
            endpoint: client,
        }
    }
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Proves: with the CA and a client certificate, `pool create` / `pool show` work against
/// an etcd that requires client certificates, and a node daemon given the same flags
/// claims a block and serves an ADD from it; with the CA alone (no client certificate)
/// the pool commands fail, naming the endpoint and the certificate flags.
#[test]
fn pools_on_an_etcd_that_requires_client_certificates() {
    let env = TestEnv::new("cluster_tls");
    let certs = env.dir("certs");
    make_certs(&certs);
    let etcd = TlsEtcd::start(&env, &certs);
    let flag =
        |name: &str, file: &str| format!("--etcd-{name}-file={}", certs.join(file).display());
    let tls = [
        flag("ca", "ca.pem"),
        flag("cert", "client.pem"),
        flag("key", "client-key.pem"),
    ];
    let e = &etcd.endpoint;
    // etcd takes a moment to serve: create is idempotent, so it is retried until then.
    let with_tls = |args: &str| format!("{args} {}", tls.join(" "));
    eventually(Duration::from_secs(30), "etcd serving over TLS", || {
        pool(e, &with_tls("create tls1 --cidr 10.62.0.0/24"))
            .status
            .success()
    });

    pool_err(e, &format!("show tls1 {}", tls[0]), &format!("etcd ({e})"));

    let tls_args: Vec<&str> = tls.iter().map(String::as_str).collect();
    let node = Node::start(&env, "tls-a", e, &tls_args);
    let r = node
        .call(&env, "ADD", "c1", &node.conf("tlsnet", &["tls1"]))
        .ok()
        .result();
    let block: ipnet::IpNet = "10.62.0.0/26".parse().unwrap();
    assert!(
        block.contains(&addresses(&r)[0].addr()),
        "the first address comes from the pool's first block: {r}"
    );
    let shown: Value = serde_json::from_str(&stdout_ok(
        "pool show over TLS",
        &pool(e, &with_tls("show tls1 --json")),
    ))
    .expect("pool show --json");
    assert_eq!(
        shown["blocks"],
        json!([{"cidr": "10.62.0.0/26", "node": "tls-a", "network": "tlsnet", "state": "owned",
                "inUse": shown["blocks"][0]["inUse"]}]),
        "{shown}"
    );
}
