//! Connecting: the SDK client (standard credential chain, region and
//! endpoint from the configuration or the environment), the queue's URL,
//! and the checks of its attributes against Idem's settings.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::QueueAttributeName;
use aws_sdk_sqs::Client;

use super::SqsOptions;

/// What the queue's attributes say.
pub(super) struct QueueInfo {
    pub url: String,
    pub fifo: bool,
    /// The longest delay a message may wait for ([`max_delay_ms`]).
    pub max_delay_ms: i64,
}

/// SQS's default `MessageRetentionPeriod` (4 days), for a server that does
/// not say.
const DEFAULT_RETENTION_SECS: i64 = 345_600;

/// The region used when neither the configuration nor the environment
/// names one and the endpoint is not AWS's (a local SQS-compatible server).
const LOCAL_REGION: &str = "us-east-1";

/// An SDK client for `options`: throttling, 5xx answers and dropped
/// connections are retried with exponential backoff (the SDK's standard
/// retry mode, five attempts).
pub(super) async fn client(options: &SqsOptions) -> Client {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(http)
        .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(5))
        .timeout_config(
            aws_config::timeout::TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                // Above the long poll's wait, and no more: a connection
                // that stalls is given up and the call retried.
                .operation_attempt_timeout(Duration::from_secs(options.wait_secs.min(20) + 5))
                .build(),
        );
    if let Some(region) = &options.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some(endpoint) = &options.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    let shared = loader.load().await;
    let mut config = aws_sdk_sqs::config::Builder::from(&shared);
    if shared.region().is_none() && options.endpoint.is_some() {
        config = config.region(aws_config::Region::new(LOCAL_REGION));
    }
    Client::from_conf(config.build())
}

/// Find the queue and check its attributes: it must exist, be readable
/// with these credentials, and its redrive policy (if any) must leave
/// Idem's dead-lettering room to come first.
pub(super) async fn queue(client: &Client, options: &SqsOptions) -> Result<QueueInfo> {
    let queue = &options.queue;
    let url = if queue.starts_with("https://") || queue.starts_with("http://") {
        queue.clone()
    } else {
        client
            .get_queue_url()
            .queue_name(queue)
            .send()
            .await
            .map_err(|e| explain(e, options))?
            .queue_url
            .with_context(|| format!("SQS answered GetQueueUrl for {queue:?} without a URL"))?
    };
    let attrs = client
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .map_err(|e| explain(e, options))?;
    let attrs = attrs.attributes.unwrap_or_default();
    let fifo = attrs.get(&QueueAttributeName::FifoQueue).is_some_and(|v| v == "true");
    let max_receives = match attrs.get(&QueueAttributeName::RedrivePolicy) {
        Some(policy) => Some(check_redrive(policy, options.max_attempts, queue)?),
        None => None,
    };
    let retention_secs = attrs
        .get(&QueueAttributeName::MessageRetentionPeriod)
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|&secs| secs > 0)
        .unwrap_or(DEFAULT_RETENTION_SECS);
    let max_delay_ms = max_delay_ms(retention_secs.saturating_mul(1000), max_receives, options.max_attempts);
    if i64::try_from(options.max_retry_delay_ms).unwrap_or(i64::MAX) > max_delay_ms {
        bail!(
            "retry.max_delay_ms = {} is longer than queue {queue:?} can hold a message for a retry ({max_delay_ms} ms: {}): a retry due later would be lost with the message; lower retry.max_delay_ms, or raise the queue's MessageRetentionPeriod",
            options.max_retry_delay_ms,
            DELAY_BOUND
        );
    }
    Ok(QueueInfo { url, fifo, max_delay_ms })
}

/// What bounds a delay on SQS, for errors.
pub(super) const DELAY_BOUND: &str = "the queue's MessageRetentionPeriod less an hour (a tenth under ten hours), and with a redrive policy no more 12-hour deferrals than its maxReceiveCount leaves after retry.max_attempts";

/// The longest delay on a queue that keeps messages `retention_ms`: an
/// hour less (a tenth less on a queue keeping them under ten hours), so
/// that a message is received and run before SQS deletes it. With a
/// redrive policy of `max_receives`, also no more 12-hour deferrals (each
/// a receive) than it leaves after one receive per attempt and one more.
pub(super) fn max_delay_ms(retention_ms: i64, max_receives: Option<u64>, max_attempts: u32) -> i64 {
    let kept = retention_ms - (retention_ms / 10).min(60 * 60 * 1000);
    let Some(max_receives) = max_receives else { return kept };
    let deferrals = max_receives.saturating_sub(u64::from(max_attempts) + 1).max(1);
    let per_deferral = (super::wire::MAX_VISIBILITY_SECS - super::track::TOTAL_VISIBILITY_SLACK_SECS) * 1000;
    kept.min(i64::try_from(deferrals).unwrap_or(i64::MAX).saturating_mul(per_deferral))
}

/// Refuse a redrive policy whose `maxReceiveCount` could move a message to
/// SQS's dead-letter queue before Idem has made its attempts: SQS counts
/// every receive, and besides one receive per attempt, a message is also
/// received when it meets a busy key, when a worker dies holding it, and
/// when it is held back for a delay. Idem's own dead-lettering must come
/// first, so that a failed message is recorded, answered and replayable.
fn check_redrive(policy: &str, max_attempts: u32, queue: &str) -> Result<u64> {
    let policy: serde_json::Value =
        serde_json::from_str(policy).with_context(|| format!("queue {queue:?}: cannot read its RedrivePolicy {policy:?}"))?;
    let max_receives = match &policy["maxReceiveCount"] {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .with_context(|| format!("queue {queue:?}: its RedrivePolicy has no maxReceiveCount"))?;
    let needed = 2 * u64::from(max_attempts);
    if max_receives < needed {
        bail!(
            "queue {queue:?} has a redrive policy with maxReceiveCount = {max_receives}, which could move messages to SQS's \
             dead-letter queue before Idem's {max_attempts} attempts (retry.max_attempts) are made: each attempt is one \
             receive, and busy keys, dead workers and delays take receives too. Raise maxReceiveCount to at least \
             {needed} (twice retry.max_attempts), or lower retry.max_attempts"
        );
    }
    Ok(max_receives)
}

/// An SDK error at start, with what to change.
fn explain<E: ProvideErrorMetadata + std::error::Error + 'static>(e: SdkError<E>, options: &SqsOptions) -> anyhow::Error {
    let queue = &options.queue;
    let at = options
        .endpoint
        .as_deref()
        .map(crate::text::redact_url)
        .unwrap_or_else(|| "AWS".into());
    let code = e.code().unwrap_or_default().to_string();
    let detail = DisplayErrorContext(&e).to_string();
    let hint = if code.contains("NonExistentQueue") || code.contains("QueueDoesNotExist") {
        format!("queue {queue:?} (broker.queue) does not exist at {at}: create it, or set broker.queue to an existing queue's name or URL")
    } else if [
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "UnrecognizedClientException",
        "InvalidSecurity",
    ]
    .iter()
    .any(|c| code.contains(c))
    {
        format!("SQS at {at} refused the AWS credentials: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the profile (AWS_PROFILE) the standard credential chain finds")
    } else if code.contains("AccessDenied") {
        format!("the AWS credentials may not use queue {queue:?}: grant sqs:GetQueueUrl, sqs:GetQueueAttributes, sqs:ReceiveMessage, sqs:DeleteMessage, sqs:ChangeMessageVisibility and sqs:SendMessage")
    } else if detail.contains("credential") {
        "no AWS credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile (AWS_PROFILE), as the standard credential chain reads them".to_string()
    } else if detail.contains("region") && options.region.is_none() {
        "no AWS region is set: set broker.region, or AWS_REGION".to_string()
    } else {
        format!("cannot reach SQS at {at} (broker.url): check that it is running and reachable")
    };
    anyhow::anyhow!("{hint} ({detail})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redrive_policy_must_leave_idem_room_to_dead_letter_first() {
        let policy = |n: &str| format!(r#"{{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:1:dlq","maxReceiveCount":{n}}}"#);
        assert!(check_redrive(&policy("10"), 5, "q").is_ok());
        assert!(check_redrive(&policy("\"12\""), 5, "q").is_ok(), "SQS writes it as a string too");
        let refused = check_redrive(&policy("6"), 5, "q").unwrap_err().to_string();
        assert!(
            refused.contains("maxReceiveCount = 6") && refused.contains("at least 10"),
            "{refused}"
        );
        assert!(check_redrive("{}", 5, "q").is_err());
    }

    #[test]
    fn delays_end_before_the_queue_deletes_the_message_or_redrives_it() {
        let (hour, day) = (60 * 60 * 1000, 24 * 60 * 60 * 1000);
        assert_eq!(max_delay_ms(4 * day, None, 5), 4 * day - hour, "the default retention");
        assert_eq!(max_delay_ms(14 * day, None, 5), 14 * day - hour);
        assert_eq!(max_delay_ms(60_000, None, 5), 54_000, "the shortest retention");
        // maxReceiveCount 10, 5 attempts: 4 deferrals of 12 hours less a
        // minute; 20: the retention bounds it.
        assert_eq!(max_delay_ms(4 * day, Some(10), 5), 4 * 43_140_000);
        assert_eq!(max_delay_ms(4 * day, Some(20), 5), 4 * day - hour);
        assert_eq!(max_delay_ms(4 * day, Some(2), 1), 43_140_000, "at least one deferral");
    }
}
