//! Integration tests: real compiled plugins, a real SQLite database per
//! test, real HTTP endpoints (a local mock), real `idem` processes killed
//! with SIGKILL.

mod common;

mod bad_input;
mod broker_amqp;
mod broker_conformance;
mod broker_kafka;
mod broker_nats;
mod broker_redis;
mod broker_sqs;
mod celery;
mod claims_model;
mod cli;
mod conformance;
mod console;
mod crash;
mod docs;
mod guarantees;
mod hostile_keys;
mod inspection;
mod joint_confirm;
mod languages;
mod operating;
mod outage;
mod pool;
mod prefork;
mod query_plans;
mod sandbox;
mod write_behind;
