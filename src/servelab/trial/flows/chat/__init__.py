"""The chat flow: launch, smoke tests, quality gate, served-behaviour checks, load steps, the goal's
mix, the arrival test, the capacity search, lifecycle checks, repeats and economics
(:class:`servelab.trial.flows.chat.flow.ChatFlow`)."""
