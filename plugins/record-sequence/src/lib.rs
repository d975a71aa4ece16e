//! Record the steps of an ordered stream, refusing any that comes out of
//! order: the plugin the ordering tests run.
//!
//! Payload: `{"stream": "acct-7", "seq": 3}`. Steps of one stream must
//! arrive as 0, 1, 2, … : a step equal to the last recorded one is a re-run
//! of it (its earlier execution was cut short after its write) and changes
//! nothing; any other step that is not the next one fails permanently, so
//! an ordering bug shows as a dead letter naming both numbers.

use idem_sdk::{permanent, store, Message, Result};
use serde::Deserialize;

#[derive(Deserialize)]
struct Step {
    stream: String,
    seq: u64,
}

fn handle(msg: Message) -> Result<()> {
    let step: Step = msg.json()?;
    let streams = store::collection("sequences");
    let last: Option<u64> = streams.get(&step.stream)?;
    let next = last.map_or(0, |l| l + 1);
    if Some(step.seq) == last {
        return Ok(());
    }
    if step.seq != next {
        return Err(permanent(format!(
            "stream {}: step {} arrived when {} was next",
            step.stream, step.seq, next
        )));
    }
    streams.upsert(&step.stream, &step.seq)?;
    Ok(())
}

idem_sdk::handler!(handle);
