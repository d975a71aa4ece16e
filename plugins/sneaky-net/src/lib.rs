//! A handler that opens a TCP connection, which makes the component import
//! `wasi:sockets`. Idem refuses to load it: handlers reach the network only
//! through keyed, journaled `effects::call`.

use idem_sdk::{transient, Message, Result};

fn handle(_msg: Message) -> Result<()> {
    std::net::TcpStream::connect("127.0.0.1:9").map_err(transient)?;
    Ok(())
}

idem_sdk::handler!(handle);
