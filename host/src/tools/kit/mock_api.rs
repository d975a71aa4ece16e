//! `idem mock-api`: the demo's mock payment, inventory and email APIs as a
//! command, so the example configurations run end to end on one machine.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;

use super::Mock;

/// `idem mock-api`.
#[derive(clap::Args, Debug, Clone)]
pub struct MockApiArgs {
    /// Address to listen on; the example configurations call
    /// 127.0.0.1:8080.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
}

/// Serve until Ctrl-C or SIGTERM.
pub async fn main(args: MockApiArgs) -> Result<ExitCode> {
    let mock = Mock::start_on(&args.listen, Duration::ZERO).await?;
    println!(
        "mock APIs on http://{}: POST /NAME (payments, inventory, email, …) performs an effect once per Idempotency-Key; GET /counts",
        mock.addr
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    let c = mock.counts();
    println!(
        "requests {}  effects {}  double effects {}  without Idempotency-Key {}",
        c.requests, c.effects, c.double_effects, c.unkeyed
    );
    Ok(ExitCode::SUCCESS)
}
