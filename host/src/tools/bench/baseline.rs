//! Scenario f's and g's baselines: the same messages published to a
//! namespace of their own, consumed by a plain loop on the same broker
//! (`kafka_loop`, `redis_loop`) in the same rotation as the pool. Scenario
//! g has two: the bare loop, and the loop with a claim and a confirm per
//! message.

use std::time::Duration;

use anyhow::Result;

use super::{kafka_loop, message, plugin_of, redis_loop, scenario_config, BenchArgs, RunFigures, Scenario};
use crate::envelope::Envelope;

/// A plain loop run beside a scenario's pool.
#[derive(Debug, Clone, Copy)]
pub(super) enum Loop {
    /// Scenario f: rdkafka consuming and upserting one record at a time.
    Kafka,
    /// Scenario g: `XREADGROUP` and `XACK`, nothing else.
    Redis,
    /// Scenario g: the same, with a claim and a confirm per message.
    RedisClaims,
}

/// The loops run beside `scenario`'s pool.
pub(super) fn loops(scenario: Scenario) -> &'static [Loop] {
    match scenario {
        Scenario::F => &[Loop::Kafka],
        Scenario::G => &[Loop::Redis, Loop::RedisClaims],
        _ => &[],
    }
}

/// One of scenario f's or g's loops, in a namespace of its own, on the same
/// messages.
pub(super) async fn run(args: &BenchArgs, scenario: Scenario, which: Loop) -> Result<RunFigures> {
    let dir = tempfile::tempdir()?;
    let config = scenario_config(args, scenario, "native", dir.path());
    let (plugin, _, _) = plugin_of(scenario);
    crate::tools::chaos::prepare_broker(&config).await?;
    let result = async {
        let all: Vec<Envelope> = (0..args.messages).map(|i| message(i, plugin, None)).collect();
        if let Loop::Redis | Loop::RedisClaims = which {
            let broker = crate::broker::redis::RedisBroker::connect(config.broker.url()?, &config.namespace).await?;
            publish(&broker, &all).await?;
            let stream = format!("{}:queue", config.namespace);
            let claims = format!("{}:loop-claim:", config.namespace);
            let claims = matches!(which, Loop::RedisClaims).then_some(claims.as_str());
            return redis_loop::run(&args.redis_url, &stream, args.messages, args.batch_size, claims).await;
        }
        let broker = crate::broker::kafka::KafkaBroker::connect(crate::backend::kafka_options(&config)?).await?;
        publish(&broker, &all).await?;
        kafka_loop::run(&config, args.messages, &args.postgres_url).await
    }
    .await;
    crate::tools::chaos::cleanup(&config).await;
    result
}

pub(super) async fn publish(broker: &dyn crate::broker::Broker, all: &[Envelope]) -> Result<()> {
    for chunk in all.chunks(500) {
        broker.publish(chunk, Duration::ZERO).await?;
    }
    Ok(())
}
