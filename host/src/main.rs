//! `service`: parses the command line and hands over to the library.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = service::cli::Cli::parse();
    match service::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
