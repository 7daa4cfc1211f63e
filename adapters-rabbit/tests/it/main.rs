//! Integration tests of the RabbitMQ adapter against a real broker: the one
//! at `AMQP_URL`, else this binary's container (flowforge-testkit). Without
//! either every test prints a notice and passes, unless
//! `REQUIRE_RABBITMQ=1`, which makes an absent broker a failure. Each test
//! declares its own randomly named exchange and queue and deletes them at
//! the end; the outage tests cut only their own connections, through a TCP
//! proxy of their own (flowforge-testkit's), and the restart test restarts
//! a broker container of its own.

// Clippy allows unwrap in test functions but not in their helpers; in a
// test binary a panic is how any helper reports failure.
#![allow(clippy::unwrap_used)]

#[macro_use]
mod support;
mod consume;
mod outage;
mod publish;
mod restart;
mod topology;
