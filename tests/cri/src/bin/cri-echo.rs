//! The pods' server and in-pod probe (std only, copied into the suite's image):
//!
//!   cri-echo serve [--tcp PORT]... [--udp PORT]...   answer with the hostname
//!   cri-echo probe tcp|udp ADDR:PORT                  print the answer, exit 1 if none

#[path = "../probe.rs"]
#[allow(dead_code)] // hostport is for the suite
mod probe;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("serve") => {
            let (mut tcp, mut udp) = (Vec::new(), Vec::new());
            for pair in args[1..].chunks(2) {
                let port: u16 = pair
                    .get(1)
                    .and_then(|p| p.parse().ok())
                    .unwrap_or_else(|| usage());
                match pair[0].as_str() {
                    "--tcp" => tcp.push(port),
                    "--udp" => udp.push(port),
                    _ => usage(),
                }
            }
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            if let Err(e) = probe::serve(&tcp, &udp, host.trim()) {
                eprintln!("cri-echo: {e}");
                std::process::exit(1);
            }
        }
        Some("probe") if args.len() == 3 => match probe::probe(&args[1], &args[2]) {
            Ok(reply) => println!("{reply}"),
            Err(e) => {
                eprintln!("cri-echo: {e}");
                std::process::exit(1);
            }
        },
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: cri-echo serve [--tcp PORT]... [--udp PORT]... | cri-echo probe tcp|udp ADDR:PORT"
    );
    std::process::exit(2)
}
