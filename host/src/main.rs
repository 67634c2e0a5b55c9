//! `service`: parses the command line and hands over to the library.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // TLS for outbound requests uses ring; install it before any client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = service::cli::Cli::parse();
    match service::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
