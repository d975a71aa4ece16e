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
    /// `MessageRetentionPeriod`, in ms: how long SQS keeps a message,
    /// due or not.
    pub retention_ms: i64,
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
    if let Some(policy) = attrs.get(&QueueAttributeName::RedrivePolicy) {
        check_redrive(policy, options.max_attempts, queue)?;
    }
    let retention_secs = attrs
        .get(&QueueAttributeName::MessageRetentionPeriod)
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|&secs| secs > 0)
        .unwrap_or(DEFAULT_RETENTION_SECS);
    Ok(QueueInfo {
        url,
        fifo,
        retention_ms: retention_secs.saturating_mul(1000),
    })
}

/// Refuse a redrive policy whose `maxReceiveCount` could move a message to
/// SQS's dead-letter queue before Idem has made its attempts: SQS counts
/// every receive, and besides one receive per attempt, a message is also
/// received when it meets a busy key, when a worker dies holding it, and
/// when it is held back for a delay. Idem's own dead-lettering must come
/// first, so that a failed message is recorded, answered and replayable.
fn check_redrive(policy: &str, max_attempts: u32, queue: &str) -> Result<()> {
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
    Ok(())
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
}
